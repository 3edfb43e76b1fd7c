"""Per-item options on a batch's outputs (`outputs.apply_options`), on small synthetic tensors."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from embedfleet.common.modeldir import Task
from embedfleet.worker.contract import EngineInfo, Options
from embedfleet.worker.engine.batch import pack, to_device
from embedfleet.worker.engine.outputs import apply_options
from embedfleet.worker.engine.pending import Slice
from embedfleet.worker.engine.pooling import Pooler, pool

from .helpers import item

HIDDEN = 8
MEAN = Pooler("mean")


def info(task: Task = "embed") -> EngineInfo:
    return EngineInfo(
        model_name="synthetic",
        task=task,
        dimensions=HIDDEN if task == "embed" else 1,
        max_input_tokens=64,
        vocab_size=100,
        dtype="float32",
        device="cpu",
        default_pooling="mean",
        default_normalize=True,
    )


def test_mixed_options_each_get_their_own_rows_and_inputs_stay_untouched() -> None:
    items = [item([[1, 2, 3], [4, 5]], Options(dimensions=4)), item([[6], [7, 8, 9, 10]])]
    items.append(item([[11, 12]], Options(pooling="cls", normalize=False)))
    host = pack([it.tokens for it in items], 0, bucket_tokens=16, bucket_sequences=8)
    batch = to_device(host, torch.device("cpu"))
    hidden = torch.randn(host.total_tokens, HIDDEN, generator=torch.Generator().manual_seed(0))
    head = pool(hidden, batch, "mean")
    hidden_before, head_before = hidden.clone(), head.clone()

    out, slices = apply_options(items, hidden, head, batch, host.real_sequences, info(), MEAN)

    assert slices == [Slice(0, 2, 4), Slice(2, 4, HIDDEN), Slice(4, 5, HIDDEN)]
    assert out.shape == (5, HIDDEN)
    torch.testing.assert_close(out[:2, :4], F.normalize(head[:2, :4], dim=-1))
    torch.testing.assert_close(out[2:4], F.normalize(head[2:4], dim=-1))
    torch.testing.assert_close(out[4], hidden[batch.first[4]])
    torch.testing.assert_close(hidden, hidden_before)
    torch.testing.assert_close(head, head_before)


def test_one_choice_for_all_items_truncates_once() -> None:
    items = [item([[1, 2]], Options(dimensions=3)), item([[3, 4, 5]], Options(dimensions=3))]
    host = pack([it.tokens for it in items])
    batch = to_device(host, torch.device("cpu"))
    hidden = torch.randn(host.total_tokens, HIDDEN, generator=torch.Generator().manual_seed(1))
    head = pool(hidden, batch, "mean")

    out, slices = apply_options(items, hidden, head, batch, host.real_sequences, info(), MEAN)

    assert slices == [Slice(0, 1, 3), Slice(1, 2, 3)]
    torch.testing.assert_close(out, F.normalize(head[:, :3], dim=-1))


def test_scores_activate_only_the_items_that_ask() -> None:
    items = [item([[1, 2], [3]], Options(activate=True)), item([[4, 5, 6]])]
    host = pack([it.tokens for it in items], 0, bucket_tokens=8, bucket_sequences=4)
    batch = to_device(host, torch.device("cpu"))
    hidden = torch.zeros(host.total_tokens, HIDDEN)
    scores = torch.tensor([0.5, -2.0, 3.0, 9.0])  # the last slot holds the padding
    before = scores.clone()

    out, slices = apply_options(
        items, hidden, scores, batch, host.real_sequences, info("score"), MEAN
    )

    assert slices == [Slice(0, 2, 0), Slice(2, 3, 0)]
    assert out.shape == (3,)
    torch.testing.assert_close(out[:2], torch.sigmoid(before[:2]))
    torch.testing.assert_close(out[2], before[2])
    torch.testing.assert_close(scores, before)
