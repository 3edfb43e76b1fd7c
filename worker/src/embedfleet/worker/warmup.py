"""Start-up warm-up and the capacity measurement the autoscaler and admission read.

`warm_up` is the minimal part a worker needs before it serves: one request of the probe's shape
pays the one-off costs (kernel loading, allocator growth, a lazy graph's eager run and capture).
`measure_capacity` is the saturation run: synthetic requests go through the real serving path
(queue, batcher, engine thread) with the queue kept full, so what is measured is tokens/s at
saturation, batching and pipelining included. It takes `--warmup-seconds`; by default it runs
after the worker serves (`--capacity-measurement background`), yielding to real requests
(`yields_to_traffic`), so a worker woken from zero answers the request that woke it first.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens
from embedfleet.worker.contract import WorkItem

Submit = Callable[[WorkItem], Awaitable[FloatArray]]

#: Background measurements that real requests interrupted before one runs regardless of them.
MAX_INTERRUPTIONS = 3
#: How long a background measurement waits for an idle period before it runs through the traffic.
BUSY_PATIENCE_SECONDS = 10.0
#: The longest one batch of a measurement that yields to traffic may run: a request arriving
#: waits for the batch in flight. The probe's full batches made the first request after an idle
#: second wait 0.3-1.3 s on a shared 2-core CPU (p50 7-100 ms): the p99 of batch-1 suites, 30-50x
#: their p50; 14-34 ms with this bound (docs/benchmarks/online_path.md).
YIELD_BATCH_SECONDS = 0.025
#: Tokens of the item a yielding measurement reads its rough rate from first (a 20-token query's
#: forward is a few ms on a CPU; a 512-token item was 10x that)
ROUGH_TOKENS = 64
#: Short probe requests outstanding: one runs while the next waits, so the engine never idles
#: between them. With one, the time around each request (the event loop's turn, the hand-off to
#: the engine thread) counted as the device's: the measured rate fell with the machine's load
#: (a capacity test failed 20% low beside an e2e run). A request arriving finds the waiting one
#: cancelled, as the full batches' queued ones are.
YIELD_OUTSTANDING = 2


def yields_to_traffic(interruptions: int, found_idle: bool = True) -> bool:
    """Whether the next background measurement stops when a real request arrives: yes, until
    MAX_INTERRUPTIONS have been stopped, or unless it found no idle period at all within
    BUSY_PATIENCE_SECONDS; then one runs through the traffic (real requests wait behind its queue
    for `--warmup-seconds`), so a worker that never idles still reports a capacity, which
    admission and the autoscaler need. Counting only stopped runs left a worker loaded from its
    first second (a fleet started into a burst) unmeasured for good: no run ever started, and
    admission, with no capacity to measure the queue by, admitted the whole overload (a 64-client
    run: 54 of 70 requests 504 at the deadline, 20 dropped by the workers past it)."""
    return found_idle and interruptions < MAX_INTERRUPTIONS


def request_tokens_of(max_batch_tokens: int) -> int:
    """Tokens of one probe request: up to 512, at most half a batch (two share a batch)."""
    return max(1, min(512, max_batch_tokens // 2))


def probe_window(rough_tokens_per_second: float, seconds: float, max_batch_tokens: int) -> int:
    """Tokens per round of the saturation probe: a full batch (--max-batch-tokens), unless the
    rough rate says a round would take more than a quarter of `seconds`.

    The time bound alone keeps a slow CPU's start-up short; a fixed token cap (it was 8,192)
    would also cap a GPU at a quarter of a 32k batch budget, measure a quarter-full batch's
    throughput and make the autoscaler over-provision.
    """
    by_time = max(1, int(rough_tokens_per_second * seconds / 4))
    return max(1, min(max_batch_tokens, by_time))


def yielding_request_tokens(rough_tokens_per_second: float, request_tokens: int) -> int | None:
    """Tokens of each probe request of a measurement that yields to traffic, where a probe
    request of `request_tokens` would run past YIELD_BATCH_SECONDS at the rough rate: as many as
    run in that time (at least 16), two requests outstanding (YIELD_OUTSTANDING). None where a
    probe request fits in it (a GPU: a few ms), which then probes with full batches as at
    start-up. On a 2-core CPU the capacity measured so stayed within noise of the full batches'
    (online_path.md)."""
    fits = int(rough_tokens_per_second * YIELD_BATCH_SECONDS)
    return None if fits >= request_tokens else max(16, fits)


def probe_seq_tokens(max_input_tokens: int, request_tokens: int) -> int:
    """Tokens of each probe sequence: the longest a served input can be (the model's limit),
    within one probe request. A transformer's cost per token grows with sequence length
    (attention), so a probe of short sequences overstates what traffic near the limit gets. One-
    thread MiniLM, tokens per CPU-second, interleaved in one process: 128-token sequences (the
    probe before) 6,426, mixed texts of 5-500 words cut at 256 (the overload benchmark's, 189
    tokens on average) 5,579, 256-token sequences 5,828: 1.15x the traffic's figure before, 1.04x
    now. Admission divides the queue by this figure, so a high one counts the queue short. Traffic
    of short texts gets somewhat more than the probe, which the gateway's delivered-capacity ratio
    learns (upwards as well as down)."""
    return max(1, min(max_input_tokens, request_tokens))


def probe_items(
    count: int, vocab_size: int, max_input_tokens: int, request_tokens: int, seed: int = 0
) -> list[WorkItem]:
    seq = probe_seq_tokens(max_input_tokens, request_tokens)
    per_request = max(1, request_tokens // seq)
    rng = np.random.default_rng(seed)
    low = 1000 if vocab_size > 2000 else 0  # skip BERT's special and unused ids
    items = []
    for _ in range(count):
        ids = rng.integers(low, vocab_size, size=seq * per_request, dtype=np.int32)
        lengths = np.full(per_request, seq, dtype=np.int32)
        items.append(WorkItem(Tokens(ids=ids, lengths=lengths)))
    return items


async def warm_up(
    submit: Submit, *, vocab_size: int, max_input_tokens: int, max_batch_tokens: int
) -> None:
    """One probe-shaped request: the one-off costs (kernel loading, allocator growth, a lazy
    graph's capture) are paid before the worker serves, not by its first real request."""
    request_tokens = request_tokens_of(max_batch_tokens)
    await submit(probe_items(1, vocab_size, max_input_tokens, request_tokens, seed=1)[0])


async def measure_capacity(
    submit: Submit,
    *,
    vocab_size: int,
    max_input_tokens: int,
    max_batch_tokens: int,
    seconds: float,
    computed: Callable[[], int] | None = None,
    stop: asyncio.Event | None = None,
) -> float | None:
    """Tokens/s from the first completed batch to the last, with the queue never empty.

    A first request, run alone, warms up and gives a rough rate; the number of tokens kept
    outstanding is sized from it so one round takes about a quarter of `seconds`, which bounds
    the run's time on a slow CPU as well as on a GPU that finishes a full batch in milliseconds.

    `computed` (the engine's running count of tokens computed, any request's) counts real
    requests that share the window too: the engine's rate at saturation, whoever sent the work.
    Without it only the probe's own tokens count. Once `stop` is set (a real request arrived), the
    probe's queued requests are cancelled (dropped before compute) and None is returned.
    """
    request_tokens = request_tokens_of(max_batch_tokens)
    (first_item,) = probe_items(1, vocab_size, max_input_tokens, request_tokens, seed=1)
    small = None
    if stop is not None:
        # A request arriving waits for the batch in flight: the rate is read from a short item
        # first, and a slow device (a CPU) keeps its probe short (`yielding_request_tokens`).
        short = min(request_tokens, ROUGH_TOKENS)
        (item,) = probe_items(1, vocab_size, max_input_tokens, short, seed=1)
        rough = await _rate(submit, item)
        small = yielding_request_tokens(rough, request_tokens)
    else:
        await submit(first_item)  # one-off costs (a yielding run follows `warm_up`, which paid)
    if small is None:
        rough = await _rate(submit, first_item)
    if stop is not None and stop.is_set():
        return None
    window = probe_window(rough, seconds, max_batch_tokens)
    outstanding = max(2, 2 * window // request_tokens)
    if small is not None:
        request_tokens, outstanding = small, YIELD_OUTSTANDING
    items = probe_items(outstanding, vocab_size, max_input_tokens, request_tokens)

    async def one(item: WorkItem) -> int:
        await submit(item)
        return item.total_tokens

    running = {asyncio.create_task(one(item)) for item in items}
    stopped = asyncio.create_task(stop.wait()) if stop is not None else None
    first: float | None = None
    first_computed = 0
    last = 0.0
    counted = 0
    turn = 0
    try:
        while running:
            waiting = running if stopped is None else running | {stopped}
            done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if stopped is not None and stopped.done():
                return None
            running -= done
            now = time.monotonic()
            tokens = sum(task.result() for task in done)
            if first is None:
                first, first_computed = now, computed() if computed else 0
            else:
                counted = computed() - first_computed if computed else counted + tokens
                last = now
            if now - first < seconds:
                for _ in done:
                    turn += 1
                    running.add(asyncio.create_task(one(items[turn % len(items)])))
    finally:
        _cancel(running)
        if stopped is not None:
            stopped.cancel()
    if first is None or last <= first:
        return rough
    return counted / (last - first)


async def _rate(submit: Submit, item: WorkItem) -> float:
    """Tokens/s of `item` run alone."""
    t0 = time.monotonic()
    await submit(item)
    return item.total_tokens / max(time.monotonic() - t0, 1e-6)


def _cancel(tasks: Iterable[asyncio.Task[int]]) -> None:
    # A cancelled submit marks its queued request, which the engine thread drops unrun.
    for task in tasks:
        task.cancel()
