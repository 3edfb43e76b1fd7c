"""Admission: taking or shedding a request before it is tokenized, by the seconds of work ahead.

A burst must not be admitted whole and then time out. So the decision comes first, on an estimate:
a request's tokens are guessed from its characters (a learned characters-per-token ratio, each
input capped at the model's limit, token-id inputs counted exactly), and the guess is corrected to
the true count once the request is tokenized. The work queued ahead of a new request is everything
this gateway admitted and has not answered yet (tokenizing, queued or computing), plus what other
gateways queued at the same workers (each worker's reported queue beyond this gateway's share).
Divided by the fleet's capacity it is seconds of work. The capacity is what each usable worker
reports it sustains saturated (timed on its own back-to-back batches of real traffic; its
warm-up measurement until it has been saturated), times how much of that the fleet really
delivers to this gateway now: while the queue stays at least a second deep the workers are
saturated, so the rate at which this gateway's requests are answered is the fleet's throughput;
its ratio to the reported figure (`delivered_ratio`) corrects what the workers' own figure cannot
see (the gateway's side, a figure not yet refreshed), and follows the reported figures when
workers come and go. A request is admitted while the work ahead
is within `max_queue_seconds`; beyond it, it is shed with 429 and a Retry-After of the seconds
until the queue is back within the bound. Its own size plays no part in the decision, so under
overload small requests cannot starve large ones; an admitted request waits about the bound at
most, then runs, which is what keeps it inside its deadline as long as the bound leaves room for
its own work.

The decisions (`decide`, `estimate_tokens`, `learned_chars_per_token`, `delivered_ratio`,
`fleet_capacity`) are pure; `Admission` holds the running sum of admitted work and the delivered
ratio, and hands out a `Ticket` per request.
"""

from __future__ import annotations

import contextvars
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from embedfleet.common.modeldir import ModelDir
from embedfleet.gateway import errors
from embedfleet.gateway.schemas import (
    ClassifyRequest,
    Document,
    EmbeddingRequest,
    RerankRequest,
    ScoreRequest,
    SparseEmbeddingRequest,
)
from embedfleet.gateway.tokenization import prompt_for

#: the estimate before any request was tokenized: English prose runs 4-5 characters per WordPiece
#: or BPE token, so 4 errs towards more tokens (sheds a little early rather than late)
FIRST_CHARS_PER_TOKEN = 4.0
#: weight of one request's measured ratio in the running estimate
LEARNING_RATE = 0.2
#: bounds of a learned ratio: one token per byte of a 4-byte character, up to long [UNK] words
MIN_CHARS_PER_TOKEN = 0.25
MAX_CHARS_PER_TOKEN = 64.0
#: the delivered throughput is sampled over periods this long, with at least this many answers
#: (a request's tokens count when it is answered, so fewer make a lumpy sample) ...
SAMPLE_SECONDS = 2.0
SAMPLE_ANSWERS = 4
#: ... in which the queue never fell below this many seconds of work (the workers were saturated)
BACKLOG_SECONDS = 1.0
#: weight of one period's sample in the running ratio, and the ratio's bounds
DELIVERED_RATE = 0.3
MIN_DELIVERED = 0.05
MAX_DELIVERED = 2.0


# --- decisions (pure) ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Verdict:
    admit: bool
    #: seconds of work queued ahead of the request (0 when the capacity is unknown)
    queued_seconds: float
    #: for a shed request: whole seconds until the queue is back within the bound (at least 1)
    retry_after: int = 0


def decide(queued_tokens: float, capacity: float, bound_seconds: float) -> Verdict:
    """Admit while the work ahead, in seconds at the fleet's capacity, is within the bound.

    No measured capacity (no usable worker has reported one) gives nothing to measure the queue
    by: the request is admitted and the dispatcher decides (503 without a ready worker).
    """
    if capacity <= 0:
        return Verdict(True, 0.0)
    seconds = max(0.0, queued_tokens) / capacity
    if seconds <= bound_seconds:
        return Verdict(True, seconds)
    return Verdict(False, seconds, max(1, math.ceil(seconds - bound_seconds)))


def delivered_ratio(
    current: float, served_tokens: int, seconds: float, capacity: float, backlogged: bool
) -> float:
    """The running ratio of delivered to measured capacity after one sample period: only a period
    whose queue stayed backlogged says what the fleet can do (a shallow queue is demand-bound)."""
    if not backlogged or seconds <= 0 or capacity <= 0:
        return current
    sample = min(MAX_DELIVERED, max(MIN_DELIVERED, served_tokens / seconds / capacity))
    return (1 - DELIVERED_RATE) * current + DELIVERED_RATE * sample


def fleet_capacity(capacities: Sequence[float]) -> float:
    """Tokens/s of the usable workers together. One that has not reported a measurement (0) is
    counted at the mean of those that have: it takes its share of chunks all the same."""
    known = [c for c in capacities if c > 0]
    if not known:
        return 0.0
    return sum(known) * len(capacities) / len(known)


@dataclass(frozen=True, slots=True)
class Work:
    """A request's inputs as admission sees them, before tokenization."""

    #: characters of each text input, or of each (query, document) pair, prompt included
    chars: tuple[int, ...] = ()
    #: tokens of the token-id inputs, exact
    tokens: int = 0
    #: the inputs are pairs (cross-encoder): more special tokens each
    pairs: bool = False


def estimate_tokens(work: Work, chars_per_token: float, max_tokens: int, specials: int) -> int:
    """Each text's characters over the ratio plus its special tokens, capped at the model's
    limit (a longer text is cut there, or refused); token-id inputs as they are."""
    per_text = (min(max_tokens, math.ceil(c / chars_per_token) + specials) for c in work.chars)
    return work.tokens + sum(per_text)


def learned_chars_per_token(
    current: float,
    chars: Sequence[int],
    lengths: Sequence[int],
    max_tokens: int,
    specials: int,
    rate: float = LEARNING_RATE,
) -> float:
    """The running ratio after one tokenized request, learned from its inputs that were not cut
    (a cut one says nothing about the ratio). `chars` and `lengths` must be the same inputs in the
    same order; when they are not (the gateway deduplicated some), nothing is learned."""
    if len(chars) != len(lengths):
        return current
    text = tokens = 0
    for c, n in zip(chars, lengths, strict=True):
        content = n - specials
        if n < max_tokens and content > 0:
            text += c
            tokens += content
    if tokens == 0:
        return current
    sample = min(MAX_CHARS_PER_TOKEN, max(MIN_CHARS_PER_TOKEN, text / tokens))
    return (1 - rate) * current + rate * sample


def work_of(
    request: EmbeddingRequest
    | SparseEmbeddingRequest
    | ClassifyRequest
    | RerankRequest
    | ScoreRequest,
    model: ModelDir,
    max_tokens: int,
) -> Work:
    """What a validated request asks for, in the shape the service will tokenize it."""
    if isinstance(request, ClassifyRequest):
        texts = [request.input] if isinstance(request.input, str) else request.input
        return Work(chars=tuple(len(t) for t in texts))
    if isinstance(request, EmbeddingRequest | SparseEmbeddingRequest):
        raw = request.input
        if isinstance(raw, str):
            raw = [raw]
        if not raw:
            return Work()
        first = raw[0]
        if isinstance(first, int):
            # One flat list of ids is one input (service.embeddings reads it the same way).
            return Work(tokens=min(len(raw), max_tokens) if request.truncate else len(raw))
        if isinstance(first, list):
            lengths = (len(s) for s in raw if isinstance(s, list))
            return Work(tokens=sum(min(n, max_tokens) if request.truncate else n for n in lengths))
        prompt = len(prompt_for(model, request.input_type))
        return Work(chars=tuple(prompt + len(t) for t in raw if isinstance(t, str)))
    if isinstance(request, RerankRequest):
        docs = [d.text if isinstance(d, Document) else d for d in request.documents]
        pairs = [(request.query, d) for d in docs]
    else:
        firsts = [request.text_1] if isinstance(request.text_1, str) else request.text_1
        seconds = [request.text_2] if isinstance(request.text_2, str) else request.text_2
        # One-to-many and many-to-one repeat the single side (service.score_pairs); lists of
        # different lengths are refused later, and cost nothing until then.
        count = max(len(firsts), len(seconds)) if firsts and seconds else 0
        pairs = [(firsts[min(i, len(firsts) - 1)], seconds[min(i, len(seconds) - 1)])
                 for i in range(count)]  # fmt: skip
    if model.task == "score":
        return Work(chars=tuple(len(a) + len(b) for a, b in pairs), pairs=True)
    # A bi-encoder embeds each distinct text once, queries first (service._pair_scores).
    query, document = len(prompt_for(model, "query")), len(prompt_for(model, "document"))
    left = (query + len(a) for a in dict.fromkeys(a for a, _ in pairs))
    right = (document + len(b) for b in dict.fromkeys(b for _, b in pairs))
    return Work(chars=(*left, *right))


# --- the state: admitted work and its tickets ----------------------------------------------------


class Ticket:
    """One admitted request's share of the queue; see `Admission.admit`."""

    __slots__ = ("_admission", "answered", "tokens", "work")

    def __init__(self, admission: Admission, work: Work, tokens: int) -> None:
        self._admission = admission
        self.work = work
        #: the estimate until `tokenized`, then the true count; 0 once released
        self.tokens = tokens
        #: set by the caller once the request was answered: its tokens count as delivered
        self.answered = False

    def tokenized(self, lengths: Sequence[int]) -> None:
        """Replace the estimate by the true token count (and learn from the difference)."""
        if self.tokens == 0:
            return
        actual = sum(lengths)
        self._admission._queued += actual - self.tokens
        self.tokens = actual
        self._admission._learn(self.work, lengths)

    def release(self) -> None:
        """The request is answered (or failed, or was cancelled): its work is no longer ahead of
        anyone. Releasing twice is harmless."""
        if self.tokens == 0:
            return
        self._admission._queued -= self.tokens
        self._admission._released(self.tokens if self.answered else 0)
        self.tokens = 0


#: the ticket of the request being served, set by the HTTP layer around the request's task so
#: that the service's one tokenization checkpoint can correct it without every endpoint passing it
current_ticket: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar(
    "embedfleet_admission_ticket", default=None
)


class Admission:
    """Admitted-but-unanswered work of this gateway, and the admit-or-shed decision.

    `queued_elsewhere` and `capacity` come from the worker pool: the tokens other gateways queued at
    the usable workers, and those workers' measured tokens/s together.
    """

    def __init__(
        self,
        model: ModelDir,
        max_tokens: int,
        bound_seconds: float,
        min_retry_after: int,
        queued_elsewhere: Callable[[], float],
        capacity: Callable[[], float],
        on_shed: Callable[[], None] = lambda: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        tokenizer = model.tokenizer()
        self._specials = tokenizer.num_special_tokens_to_add(False)
        self._pair_specials = tokenizer.num_special_tokens_to_add(True)
        self._model = model
        self._max_tokens = max_tokens
        self._bound = bound_seconds
        self._min_retry_after = min_retry_after
        self._elsewhere = queued_elsewhere
        self._capacity = capacity
        self._on_shed = on_shed
        self._clock = clock
        self._queued = 0
        self.chars_per_token = FIRST_CHARS_PER_TOKEN
        #: delivered over measured capacity (delivered_ratio), and the period being sampled
        self.delivered = 1.0
        self._period_start = clock()
        self._period_served = 0
        self._period_answers = 0
        self._backlogged = False

    @property
    def queued_tokens(self) -> int:
        """Tokens this gateway admitted and has not answered (estimates until tokenized)."""
        return self._queued

    def capacity(self) -> float:
        """Tokens/s the fleet delivers: the workers' measurement, corrected by what it delivered."""
        return self._capacity() * self.delivered

    def queued_seconds(self) -> float:
        """Seconds of work ahead of a request arriving now (0 with no measured capacity)."""
        return decide(self._queued + self._elsewhere(), self.capacity(), math.inf).queued_seconds

    def estimate(self, work: Work) -> int:
        specials = self._pair_specials if work.pairs else self._specials
        return estimate_tokens(work, self.chars_per_token, self._max_tokens, specials)

    def admit(
        self,
        request: EmbeddingRequest
        | SparseEmbeddingRequest
        | ClassifyRequest
        | RerankRequest
        | ScoreRequest,
    ) -> Ticket:
        """A ticket for the request, or 429 (`errors.overloaded`) when the queue is past its
        bound. The caller releases the ticket when the request ends, however it ends."""
        self._sample()
        verdict = decide(self._queued + self._elsewhere(), self.capacity(), self._bound)
        if not verdict.admit:
            self._on_shed()
            raise errors.overloaded(
                max(self._min_retry_after, verdict.retry_after),
                f"The workers have {verdict.queued_seconds:.1f}s of work queued, more than this "
                f"gateway's bound of {self._bound:g}s; retry later.",
            )
        work = work_of(request, self._model, self._max_tokens)
        ticket = Ticket(self, work, self.estimate(work))
        self._queued += ticket.tokens
        return ticket

    def _released(self, served: int) -> None:
        """A ticket was released, `served` of its tokens answered (0: it failed or its client
        went): count what was delivered, and see whether the queue is still deep."""
        if served:
            self._period_served += served
            self._period_answers += 1
        self._sample()

    def _sample(self) -> None:
        """Close the sample period once it is long enough; note whether the queue stayed deep.
        The queue only shrinks when a request is released, which samples, so no dip is missed."""
        capacity = self._capacity()
        if capacity > 0 and self._queued < BACKLOG_SECONDS * capacity * self.delivered:
            self._backlogged = False
        now = self._clock()
        if now - self._period_start < SAMPLE_SECONDS:
            return
        if self._backlogged and self._period_answers < SAMPLE_ANSWERS:
            return  # a slow fleet: a longer period, still to be backlogged throughout
        self.delivered = delivered_ratio(
            self.delivered, self._period_served, now - self._period_start, capacity,
            self._backlogged,
        )  # fmt: skip
        self._period_start, self._period_served, self._period_answers = now, 0, 0
        self._backlogged = (
            capacity > 0 and self._queued >= BACKLOG_SECONDS * capacity * self.delivered
        )

    def _learn(self, work: Work, lengths: Sequence[int]) -> None:
        specials = self._pair_specials if work.pairs else self._specials
        self.chars_per_token = learned_chars_per_token(
            self.chars_per_token, work.chars, lengths, self._max_tokens, specials
        )


def tokenized(lengths: Sequence[int]) -> None:
    """Correct the current request's ticket (if it has one) to its tokenized lengths."""
    ticket = current_ticket.get()
    if ticket is not None:
        ticket.tokenized(lengths)
