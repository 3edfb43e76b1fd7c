"""CPU engine paths side by side: eager PyTorch, torch.compile (inductor) and OpenVINO, each at
float32 and bfloat16 (OpenVINO also f16), behind the same engine, on the same packed batches.

Points: batch 1 at 20, 128 and 512 tokens, and 16 ~20-token queries in one batch (MiniLM allowing
512 tokens, pre-tokenized ids, so tokenization is not in the figures). Every round times every
path on every point once, in turn, so a noisy neighbour hurts them alike; figures are p50 over
the rounds, ratios against eager float32 in the same run, and the min cosine of each path's
vectors against sentence-transformers' own modules on the same ids (float32). Start-up is the
engine's construction (load, dtype probe, conversion, compilation) plus each point's first run
(where torch.compile compiles).

    python -m embedfleet.bench.cpu_paths [--rounds 15] [--paths eager-fp32,openvino-bf16,...]

The printed table ends with one JSON line for scripts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.similarity import min_cosine

#: path name -> (--cpu-runtime, --dtype)
PATHS: dict[str, tuple[str, str]] = {
    "eager-fp32": ("eager", "float32"),
    "eager-bf16": ("eager", "bfloat16"),
    "inductor-fp32": ("inductor", "float32"),
    "inductor-bf16": ("inductor", "bfloat16"),
    "openvino-fp32": ("openvino", "float32"),
    "openvino-bf16": ("openvino", "bfloat16"),
    "openvino-fp16": ("openvino", "float16"),
}
BASELINE = "eager-fp32"

#: point name -> sequence lengths of its one batch
POINTS: dict[str, tuple[int, ...]] = {
    "b1@20": (20,),
    "b1@128": (128,),
    "b1@512": (512,),
    "b16x20": (20,) * 16,
}


@dataclass
class Measured:
    startup_s: float
    times: dict[str, list[float]]
    cosine: dict[str, float]


def sequences(tokenizer: Any, lengths: tuple[int, ...], seed: int) -> list[list[int]]:
    """[CLS] words [SEP] of exactly each length, different words per sequence."""
    rng = np.random.default_rng(seed)
    words = ("query", "document", "river", "mountain", "weather", "engine", "graph", "kernel")
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    out = []
    for n in lengths:
        text = " ".join(rng.choice(words, 4 * n))
        body = tokenizer.encode(text, add_special_tokens=False).ids
        out.append([cls, *body[: n - 2], sep])
    return out


def reference(model_path: str, seqs: list[list[int]]) -> FloatArray:
    """sentence-transformers' modules (BERT, mean pooling, normalize), float32, one padded batch."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(model_path, device="cpu")
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    with torch.inference_mode():
        features = {"input_ids": ids, "attention_mask": mask, "token_type_ids": 0 * ids}
        out: FloatArray = st(features)["sentence_embedding"].numpy()
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from embedfleet.worker.engine.config import EngineConfig
    from embedfleet.worker.engine.torch_engine import TorchEngine

    from .engine import _items

    if args.threads:
        torch.set_num_threads(args.threads)
    names = [p for p in args.paths.split(",") if p]
    unknown = set(names) - set(PATHS)
    if unknown:
        raise SystemExit(f"unknown paths {sorted(unknown)}; use {list(PATHS)}")
    if BASELINE not in names:
        names.insert(0, BASELINE)
    engines: dict[str, Any] = {}
    measured: dict[str, Measured] = {}
    batches: dict[str, list[list[int]]] = {}
    refs: dict[str, FloatArray] = {}
    for name in names:
        runtime, dtype = PATHS[name]
        start = time.perf_counter()
        engine = TorchEngine(
            EngineConfig(
                device="cpu",
                dtype=dtype,
                cpu_runtime=runtime,
                max_input_tokens=512,
                threads=args.threads,
            )
        )
        if not batches:
            tok = engine.model_dir.tokenizer()
            for i, (point, lengths) in enumerate(POINTS.items()):
                batches[point] = sequences(tok, lengths, args.seed + i)
                refs[point] = reference(str(engine.model_dir.path), batches[point])
        cosine = {}
        with torch.inference_mode():
            for point, seqs in batches.items():
                [got] = engine.run(_items(seqs))
                cosine[point] = min_cosine(got, refs[point])
        startup = time.perf_counter() - start
        engines[name] = engine
        measured[name] = Measured(startup, {p: [] for p in POINTS}, cosine)
        print(f"{name}: ready in {startup:.1f} s ({engine.info.dtype})", flush=True)
    for _ in range(args.rounds):
        for point, seqs in batches.items():
            items = _items(seqs)
            for name in names:
                start = time.perf_counter()
                engines[name].run(items)
                measured[name].times[point].append(time.perf_counter() - start)
    base = {p: statistics.median(measured[BASELINE].times[p]) for p in POINTS}
    result: dict[str, Any] = {
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "paths": {},
    }
    for name in names:
        m = measured[name]
        p50 = {p: statistics.median(m.times[p]) for p in POINTS}
        result["paths"][name] = {
            "dtype": engines[name].info.dtype,
            "startup_s": round(m.startup_s, 2),
            "p50_ms": {p: round(1e3 * t, 2) for p, t in p50.items()},
            "ratio": {p: round(p50[p] / base[p], 3) for p in POINTS},
            "min_cosine": {p: round(c, 6) for p, c in m.cosine.items()},
        }
    return result


def table(result: dict[str, Any]) -> str:
    head = "| path | start-up s | " + " | ".join(f"{p} p50 ms (× eager fp32)" for p in POINTS)
    lines = [head + " | min cosine |", "|---" * (len(POINTS) + 3) + "|"]
    for name, r in result["paths"].items():
        cells = [f"{r['p50_ms'][p]:.1f} ({r['ratio'][p]:.2f}×)" for p in POINTS]
        cos = min(r["min_cosine"].values())
        lines.append(f"| {name} | {r['startup_s']:.1f} | " + " | ".join(cells) + f" | {cos:.5f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m embedfleet.bench.cpu_paths", description=__doc__
    )
    parser.add_argument(
        "--paths", default=",".join(PATHS), help="comma-separated, of " + ", ".join(PATHS)
    )
    parser.add_argument("--rounds", type=int, default=15, help="timed runs per path and point")
    parser.add_argument("--threads", type=int, default=0, help="threads (0: one per core)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    result = run(args)
    print(table(result))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
