"""The capacity probe's shape: sequences as long as a served input can be."""

from __future__ import annotations

from embedfleet.worker.warmup import probe_items, probe_seq_tokens, request_tokens_of


def test_the_probe_runs_sequences_at_the_models_limit() -> None:
    # MiniLM serves 256 tokens: the probe ran 128-token sequences, whose cost per token is below
    # what traffic near the limit costs (attention grows with length), so capacity read high.
    request = request_tokens_of(16384)
    (item,) = probe_items(1, 30522, 256, request)
    assert item.tokens.lengths.tolist() == [256, 256]
    assert probe_seq_tokens(256, request) == 256


def test_the_probe_stays_within_one_request_and_the_limit() -> None:
    assert probe_seq_tokens(40960, 512) == 512  # a long-context model: one 512-token sequence
    assert probe_seq_tokens(64, 512) == 64
    (item,) = probe_items(1, 30522, 40960, 512)
    assert item.total_tokens == 512
