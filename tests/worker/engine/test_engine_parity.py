"""The real MiniLM against sentence-transformers: parity, batch invariance, padding, options."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from embedfleet.common.similarity import min_cosine
from embedfleet.worker.contract import Options
from embedfleet.worker.engine.batch import pack, to_device
from embedfleet.worker.engine.config import EngineConfig
from embedfleet.worker.engine.torch_engine import TorchEngine

from .helpers import RUNTIMES, item, minilm

#: each runtime held to every family at each dtype, and inductor at float32 (helpers.RUNTIMES);
#: five engines, so the cache of six (helpers.cached_engine) serves both tests without rebuilding
ENGINES = [
    *((runtime, dtype) for runtime in RUNTIMES for dtype in ("float32", "bfloat16")),
    ("inductor", "float32"),
]


@pytest.mark.parametrize(("runtime", "dtype"), ENGINES)
def test_parity_mixed_lengths_one_batch(
    runtime: str,
    dtype: str,
    minilm_sequences: list[list[int]],
    minilm_reference: np.ndarray,
) -> None:
    engine = minilm(dtype, runtime)
    [got] = engine.run([item(minilm_sequences)])
    assert got.shape == minilm_reference.shape == (len(minilm_sequences), 384)
    assert min_cosine(got, minilm_reference) >= 0.999
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("pays", [True, False])
def test_auto_dtype_needs_native_bf16_speed_and_parity(
    monkeypatch: pytest.MonkeyPatch, pays: bool
) -> None:
    from embedfleet.worker.engine import precision
    from embedfleet.worker.engine.precision import cpu_has_native_bf16

    # The speed half of the choice is a timing; fix its answer to test both branches.
    monkeypatch.setattr(precision, "reduced_precision_pays", lambda dtype, hidden: pays)
    auto = TorchEngine(EngineConfig(device="cpu", cpu_runtime="eager"))
    native = cpu_has_native_bf16()
    # MiniLM passes the parity probe, so bf16 is kept whenever it is native and pays.
    assert auto.info.dtype == ("bfloat16" if native and pays else "float32")
    assert str(auto.model.word.dtype) == "torch." + auto.info.dtype  # type: ignore[attr-defined]


@pytest.mark.parametrize(("runtime", "dtype"), ENGINES)
def test_batch_invariance(
    runtime: str,
    dtype: str,
    minilm_sequences: list[list[int]],
    minilm_reference: np.ndarray,
) -> None:
    reference = minilm_reference
    bar = 0.99999 if dtype == "float32" else 0.9995
    engine = minilm(dtype, runtime)
    seqs = [s for s in minilm_sequences if len(s) <= 257]  # invariance needs no long ones
    [together] = engine.run([item(seqs)])
    order = np.random.default_rng(3).permutation(len(seqs))
    # Shuffled, split over several work items, each sequence with other neighbours.
    items = [item([seqs[i] for i in order[k : k + 5]]) for k in range(0, len(seqs), 5)]
    shuffled = np.concatenate(engine.run(items))
    back = np.empty_like(shuffled)
    back[order] = shuffled
    alone = np.concatenate([engine.run([item([s])])[0] for s in seqs])
    assert min_cosine(together, back) >= bar
    assert min_cosine(together, alone) >= bar
    # ... and each alone meets the parity bar too.
    assert min_cosine(alone, reference[: len(seqs)]) >= 0.999


def test_bucket_padding_changes_nothing(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    parts = [item(minilm_sequences[:12]).tokens]
    real_tokens = sum(len(s) for s in minilm_sequences[:12])
    with torch.inference_mode():
        plain = pack(parts)
        padded = pack(parts, 0, bucket_tokens=real_tokens + 150, bucket_sequences=32)
        assert padded.total_tokens == real_tokens + 150
        assert padded.sequences == 32
        outs = []
        for host in (plain, padded):
            batch = to_device(host, minilm_fp32.device)
            hidden, pooled, _ = minilm_fp32._body(batch, int(host.lengths.max()), host)
            outs.append((hidden[:real_tokens], pooled[:12]))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-5, rtol=1e-5)


def test_options_pooling_matryoshka_normalize(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    seqs = minilm_sequences[3:9]
    engine = minilm_fp32
    [raw] = engine.run([item(seqs, Options(normalize=False))])
    [default] = engine.run([item(seqs)])
    np.testing.assert_allclose(default, raw / np.linalg.norm(raw, axis=1, keepdims=True), atol=1e-6)
    # Matryoshka: truncate first, then normalize.
    [small] = engine.run([item(seqs, Options(dimensions=128))])
    assert small.shape == (len(seqs), 128)
    cut = raw[:, :128]
    np.testing.assert_allclose(small, cut / np.linalg.norm(cut, axis=1, keepdims=True), atol=1e-6)
    # cls / last-token pooling read the first / last token's hidden state.
    with torch.inference_mode():
        host = pack([item(seqs).tokens])
        batch = to_device(host, engine.device)
        hidden, *_ = engine._body(batch, int(host.lengths.max()), host)
        first = F.normalize(hidden[batch.first].float(), dim=-1).numpy()
        last = F.normalize(hidden[batch.last].float(), dim=-1).numpy()
    [cls] = engine.run([item(seqs, Options(pooling="cls"))])
    [tail] = engine.run([item(seqs, Options(pooling="last_token"))])
    np.testing.assert_allclose(cls, first, atol=1e-6)
    np.testing.assert_allclose(tail, last, atol=1e-6)
    # Different options side by side in one batch give what each gives alone.
    mixed = engine.run(
        [
            item(seqs[:2], Options(dimensions=64)),
            item(seqs[2:4], Options(pooling="cls")),
            item(seqs[4:], Options(normalize=False)),
        ]
    )
    assert mixed[0].shape == (2, 64)
    assert mixed[1].shape == (2, 384)
    assert mixed[0].flags.c_contiguous
    np.testing.assert_allclose(
        mixed[0], small[:2, :64] / np.linalg.norm(small[:2, :64], axis=1, keepdims=True), atol=1e-5
    )
    np.testing.assert_allclose(mixed[1], cls[2:4], atol=1e-5)
    np.testing.assert_allclose(mixed[2], raw[4:], atol=1e-4)


def test_explicit_zero_type_ids_match_none(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    seqs = minilm_sequences[5:8]
    [a] = minilm_fp32.run([item(seqs)])
    [b] = minilm_fp32.run([item(seqs, types=True)])
    np.testing.assert_array_equal(a, b)


def test_cpu_results_are_complete_on_return(
    minilm_fp32: TorchEngine, minilm_sequences: list[list[int]]
) -> None:
    pending = minilm_fp32.step([item(minilm_sequences[:3])])
    assert pending.ready()
    assert pending.wait()[0].dtype == np.float32
    assert minilm_fp32.counters().captures == 0
    assert minilm_fp32.counters().eager_runs > 0
