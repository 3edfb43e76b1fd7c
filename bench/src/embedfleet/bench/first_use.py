"""What a shape's first use costs on the CPU engine: is there a compile per length to warm?

The engine built as `embedfleet serve` builds it (`--cpu-runtime auto`, the OpenVINO graph kept in
the user's cache), warmed as a worker warms (one 512-token probe). Then, for single sequences of
lengths it has never run, each length four times in a row: the first run against the second is
the first use's cost; the third against the fourth, both repeats, is the noise floor.

    python -m embedfleet.bench.first_use [--runtime auto] [--step 6] [--up-to 200]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from embedfleet.bench import peers
from embedfleet.common.codec import Tokens
from embedfleet.fleet.supervisor import kept_openvino_args
from embedfleet.worker.contract import WorkItem


def main(argv: Sequence[str] | None = None) -> int:
    import torch

    from embedfleet.worker.engine.config import EngineConfig
    from embedfleet.worker.engine.torch_engine import TorchEngine

    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench.first_use")
    parser.add_argument("--runtime", default="auto", help="the workers' --cpu-runtime")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--step", type=int, default=6, help="lengths from 17 in this step")
    parser.add_argument("--up-to", type=int, default=200)
    args = parser.parse_args(argv)
    kept = kept_openvino_args()
    engine = TorchEngine(
        EngineConfig(
            model=str(peers.served_model_dir()),
            device="cpu",
            cpu_runtime=args.runtime,
            max_input_tokens=peers.MAX_TOKENS,
            threads=args.threads,
            openvino_cache_dir=kept[1] if kept else "",
        )
    )
    rng = np.random.default_rng(0)

    def ms(length: int) -> float:
        ids = rng.integers(1000, 30000, length).astype(np.int32)
        item = WorkItem(Tokens(ids=ids, lengths=np.array([length], np.int32)))
        started = time.perf_counter()
        engine.step([item]).wait()
        return (time.perf_counter() - started) * 1e3

    firsts, ratios, noise = [], [], []
    with torch.inference_mode():
        ms(peers.MAX_TOKENS)  # as warm_up does
        for length in range(17, args.up_to + 1, args.step):
            first, second, third, fourth = (ms(length) for _ in range(4))
            firsts.append(first)
            ratios.append(first / second)
            noise.append(third / fourth)
    print(
        f"{engine.runtime_name}, {len(ratios)} new lengths 17..{args.up_to}: first / second run "
        f"median {np.median(ratios):.2f}x, p90 {np.percentile(ratios, 90):.2f}x; repeats "
        f"(third / fourth) median {np.median(noise):.2f}x, p90 {np.percentile(noise, 90):.2f}x; "
        f"first runs {sum(firsts) / 1e3:.2f} s in all"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
