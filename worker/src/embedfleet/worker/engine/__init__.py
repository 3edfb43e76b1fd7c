"""The PyTorch engine's internals: ragged batches, model families, attention, graphs, dtype choice.

Empty on purpose: importing a pure module such as `graph_policy` must not pull in torch.
"""
