"""Start-up warm-up that doubles as the capacity measurement the autoscaler reads.

Synthetic requests go through the real serving path (queue, batcher, engine thread) with the queue
kept full, so what is measured is tokens/s at saturation, batching and pipelining included. One-off
costs (allocator growth, a lazy graph's eager run and capture) fall before the timed window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens
from embedfleet.worker.contract import WorkItem

Submit = Callable[[WorkItem], Awaitable[FloatArray]]

_SEQ_TOKENS = 128


def probe_window(rough_tokens_per_second: float, seconds: float, max_batch_tokens: int) -> int:
    """Tokens per round of the saturation probe: a full batch (--max-batch-tokens), unless the
    rough rate says a round would take more than a quarter of `seconds`.

    The time bound alone keeps a slow CPU's start-up short; a fixed token cap (it was 8,192)
    would also cap a GPU at a quarter of a 32k batch budget, measure a quarter-full batch's
    throughput and make the autoscaler over-provision.
    """
    by_time = max(1, int(rough_tokens_per_second * seconds / 4))
    return max(1, min(max_batch_tokens, by_time))


def probe_items(
    count: int, vocab_size: int, max_input_tokens: int, request_tokens: int, seed: int = 0
) -> list[WorkItem]:
    seq = max(1, min(_SEQ_TOKENS, max_input_tokens, request_tokens))
    per_request = max(1, request_tokens // seq)
    rng = np.random.default_rng(seed)
    low = 1000 if vocab_size > 2000 else 0  # skip BERT's special and unused ids
    items = []
    for _ in range(count):
        ids = rng.integers(low, vocab_size, size=seq * per_request, dtype=np.int32)
        lengths = np.full(per_request, seq, dtype=np.int32)
        items.append(WorkItem(Tokens(ids=ids, lengths=lengths)))
    return items


async def measure_capacity(
    submit: Submit,
    *,
    vocab_size: int,
    max_input_tokens: int,
    max_batch_tokens: int,
    seconds: float,
) -> float:
    """Tokens/s from the first completed batch to the last, with the queue never empty.

    A first request, run alone, warms up and gives a rough rate; the number of tokens kept
    outstanding is sized from it so one round takes about a quarter of `seconds`, which bounds
    the start-up time on a slow CPU as well as on a GPU that finishes a full batch in milliseconds.
    """
    request_tokens = max(1, min(512, max_batch_tokens // 2))
    (first_item,) = probe_items(1, vocab_size, max_input_tokens, request_tokens, seed=1)
    await submit(first_item)  # one-off costs: kernel loading, allocator growth
    t0 = time.monotonic()
    await submit(first_item)
    rough = first_item.total_tokens / max(time.monotonic() - t0, 1e-6)
    window = probe_window(rough, seconds, max_batch_tokens)
    outstanding = max(2, 2 * window // request_tokens)
    items = probe_items(outstanding, vocab_size, max_input_tokens, request_tokens)

    async def one(item: WorkItem) -> int:
        await submit(item)
        return item.total_tokens

    running = {asyncio.create_task(one(item)) for item in items}
    first: float | None = None
    last = 0.0
    counted = 0
    turn = 0
    while running:
        done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        now = time.monotonic()
        tokens = sum(task.result() for task in done)
        if first is None:
            first = now
        else:
            counted += tokens
            last = now
        if now - first < seconds:
            for _ in done:
                turn += 1
                running.add(asyncio.create_task(one(items[turn % len(items)])))
    if first is None or last <= first:
        return rough
    return counted / (last - first)
