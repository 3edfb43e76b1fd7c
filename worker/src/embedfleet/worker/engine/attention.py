"""Attention over a ragged batch, behind one small interface.

A backend turns the batch layout into a plan once per forward; every layer then calls
`plan.attend(q, k, v)` with packed [T, heads, head_dim] tensors. Backends:

- `flash-attn`: flash-attn's varlen kernel (CUDA, fp16/bf16), when the package imports.
- `torch-varlen`: `torch.nn.attention.varlen.varlen_attn` (the same kind of kernel, shipped in
  recent torch; CUDA, fp16/bf16), when the installed torch has it.
- `torch-grouped`: any device, any dtype. Sequences are sorted by length and cut into groups of
  similar length; each group is gathered into [B, L] and goes through one SDPA call with a key mask
  (no mask when the group's lengths are equal, or for causal attention, where right padding is never
  seen by a real query). Bounded padding, one fused kernel per group instead of per sequence.

- `flashinfer`: FlashInfer's ragged prefill (`BatchPrefillWithRaggedKVCacheWrapper`), when the
  package imports (it does not ship with the images: its wheel is ~100 MB with a JIT toolchain).
  Its plan is made on the host per batch, so it is not captured (`graph_safe` is False).

The varlen plans depend only on `cu_seqlens` and a max length, so they can be captured in a CUDA
graph; the grouped plan's shapes follow the lengths, so it cannot (`graph_safe` is False).

Beyond full attention within each sequence a model may ask for two things (its `Shape` lists
them; only backends offering them are considered): a sliding window (`plan.windowed(w)`: each
query sees the keys at most `w` positions away; ModernBERT's local layers, Gemma3's, Mistral's)
and a position bias (`plan.biased(bias)`: `bias(key position - query position)` added to every
score, MPNet's relative buckets). The varlen kernels take a window in the kernel (no extra
memory); no varlen kernel takes an arbitrary bias, so a biased model runs the grouped or the
padded plan, which add it as an attention mask: [B, heads, L, L] per group (groups of a biased
plan are capped at `BIASED_GROUP_SCORES` query-key pairs so that mask stays small), and no CUDA
graphs.

A batch may also say that only the first `keys[i]` tokens of sequence i are keys (`plan(...,
keys=)`; PyLate's query expansion without attending to its expansion tokens): every token still
gets an output, but no query sees the tokens past that prefix. Only the grouped plan takes it (a
`keys` feature): its per-group key mask is cut at the prefix instead of the length. The engine
runs such a batch eager on the grouped backend whatever the model's own backend (varlen kernels
and captured graphs see only `cu_seqlens`); a batch without key lengths plans as before.

`auto` picks among what is available by a start-up micro-benchmark on the device (one ragged batch
shaped like the model's attention; the graph-safe backends only, when graphs are wanted and one
exists); the choice and the timings are logged and the engine exports the choice as a metric label.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F  # noqa: N812 - the universal alias

from embedfleet.worker.contract import UnservableError

log = logging.getLogger(__name__)


#: what a model's attention may need of a backend beyond full attention within each sequence
Feature = Literal["window", "bias", "keys"]
FEATURES: frozenset[Feature] = frozenset(get_args(Feature))

#: the most query-key pairs (sequences x L x L) one group of a biased grouped plan holds: its
#: float mask is that many scores per head (2^20 x 12 heads x 4 bytes = 48 MB)
BIASED_GROUP_SCORES = 1 << 20


class PositionBias(Protocol):
    def __call__(self, relative: torch.Tensor) -> torch.Tensor:
        """relative [Lq, Lk] int64 (key position - query position) -> [heads, Lq, Lk] scores
        to add, in the compute dtype."""
        ...


class AttentionPlan(Protocol):
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [T, Hq, D], k and v [T, Hkv, D] (Hq a multiple of Hkv) -> [T, Hq, D]."""
        ...

    def windowed(self, window: int) -> AttentionPlan:
        """The same batch where each query sees only keys at most `window` positions away (and
        none after it when causal). Made once per forward, used by the layers that slide."""
        ...

    def biased(self, bias: PositionBias) -> AttentionPlan:
        """The same batch with `bias` added to every query-key score. Made once per forward."""
        ...


def relative_positions(length: int, device: torch.device) -> torch.Tensor:
    """[L, L] int64: key position - query position, for one sequence of `length` slots."""
    pos = torch.arange(length, device=device)
    return pos[None, :] - pos[:, None]


def visible(relative: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """[Lq, Lk] bool: which keys a query sees, by their relative position (window -1: all)."""
    seen = relative.abs() <= window if window >= 0 else torch.ones_like(relative, dtype=torch.bool)
    return seen & (relative <= 0) if causal else seen


class UnsupportedFeatureError(NotImplementedError):
    """A plan asked for a window or a bias its backend does not offer (`features`)."""


class AttentionBackend(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def graph_safe(self) -> bool:
        """Whether a plan can be captured in a CUDA graph (fixed shapes, no host sync)."""
        ...

    @property
    def features(self) -> frozenset[Feature]:
        """What its plans offer beyond full attention (`windowed`, `biased`)."""
        ...

    def plan(
        self,
        cu_seqlens: torch.Tensor,
        lengths: npt.NDArray[np.int64],
        max_seqlen: int,
        causal: bool,
        keys: npt.NDArray[np.int64] | None = None,
    ) -> AttentionPlan:
        """`keys`: each sequence's count of leading tokens that are keys (None: all of them);
        only a backend offering the `keys` feature takes it."""
        ...


# --------------------------------------------------------------------------------------------
# varlen kernels


@dataclass(frozen=True, slots=True)
class _VarlenPlan:
    #: kernel(q, k, v, cu_seqlens, max_seqlen, causal, window): window -1 is unbounded
    kernel: Callable[..., torch.Tensor]
    cu_seqlens: torch.Tensor
    max_seqlen: int
    causal: bool
    features: frozenset[Feature]
    window: int = -1

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.kernel(q, k, v, self.cu_seqlens, self.max_seqlen, self.causal, self.window)

    def windowed(self, window: int) -> AttentionPlan:
        if "window" not in self.features:
            raise UnsupportedFeatureError("this varlen kernel takes no window")
        return dataclasses.replace(self, window=window)

    def biased(self, bias: PositionBias) -> AttentionPlan:
        raise UnsupportedFeatureError("no varlen kernel adds a position bias")


def _window_size(causal: bool, window: int) -> tuple[int, int]:
    """flash-attn's (left, right) bounds: -1 is unbounded."""
    return (window, 0 if causal else window)


def _flash_attn_kernel() -> Callable[..., torch.Tensor] | None:
    if importlib.util.find_spec("flash_attn") is None:
        return None
    try:
        func: Any = importlib.import_module("flash_attn").flash_attn_varlen_func
    except (ImportError, AttributeError):
        return None

    def kernel(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu: torch.Tensor,
        max_len: int,
        causal: bool,
        window: int = -1,
    ) -> torch.Tensor:
        out: torch.Tensor = func(
            q,
            k,
            v,
            cu,
            cu,
            max_len,
            max_len,
            causal=causal,
            window_size=_window_size(causal, window),
        )
        return out

    return kernel


def _flash_forward_kernel() -> Callable[..., torch.Tensor] | None:
    """torch's own flash kernel called as `varlen_attn` calls it, minus what that wrapper adds per
    call: a zero-filled rng state (a fill kernel every layer, for a dropout that is always 0) and,
    on releases without `enable_gqa`, `repeat_interleave` copies of k and v. The kernel takes
    grouped heads as they are and a two-sided window. None where the op lacks the window
    arguments (then `varlen_attn` is the way in)."""
    op: Any = getattr(torch.ops.aten, "_flash_attention_forward", None)
    if op is None:
        return None
    try:
        names = {a.name for a in op.default._schema.arguments}
    except AttributeError:
        return None
    if not {"window_size_left", "window_size_right"} <= names:
        return None

    def kernel(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu: torch.Tensor,
        max_len: int,
        causal: bool,
        window: int = -1,
    ) -> torch.Tensor:
        left, right = _window_size(causal, window)
        out: torch.Tensor = op(
            q, k, v, cu, cu, max_len, max_len, 0.0, causal, False,
            window_size_left=left, window_size_right=right,
        )[0]  # fmt: skip
        return out

    return kernel


def _torch_varlen_kernel() -> tuple[Callable[..., torch.Tensor], frozenset[Feature]] | None:
    """The kernel and what it offers: releases with a `window_size` take a sliding window."""
    direct = _flash_forward_kernel()
    if direct is not None:
        return direct, frozenset[Feature](["window"])
    try:
        func: Any = importlib.import_module("torch.nn.attention.varlen").varlen_attn
        params = inspect.signature(func).parameters
    except (ImportError, AttributeError, ValueError, TypeError):
        return None
    # The signature moved between releases: 2.11 takes is_causal; later ones a window and GQA.
    has_window, has_gqa = "window_size" in params, "enable_gqa" in params
    if not has_window and "is_causal" not in params:
        return None

    def kernel(
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        cu: torch.Tensor,
        max_len: int,
        causal: bool,
        window: int = -1,
    ) -> torch.Tensor:
        extra: dict[str, Any] = {}
        if q.shape[1] != k.shape[1]:
            if has_gqa:
                extra["enable_gqa"] = True
            else:
                group = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        if has_window:
            extra["window_size"] = _window_size(causal, window)
        else:
            assert window < 0, "a kernel without window_size was offered a window"
            extra["is_causal"] = causal
        out: torch.Tensor = func(q, k, v, cu, cu, max_len, max_len, **extra)
        return out

    return kernel, frozenset[Feature](["window"] if has_window else [])


@dataclass(frozen=True, slots=True)
class VarlenBackend:
    name: str
    kernel: Callable[..., torch.Tensor]
    graph_safe: bool = True
    features: frozenset[Feature] = frozenset()

    def plan(
        self,
        cu_seqlens: torch.Tensor,
        lengths: npt.NDArray[np.int64],
        max_seqlen: int,
        causal: bool,
        keys: npt.NDArray[np.int64] | None = None,
    ) -> AttentionPlan:
        _no_keys(self.name, keys)
        return _VarlenPlan(self.kernel, cu_seqlens, max_seqlen, causal, self.features)


def _no_keys(name: str, keys: npt.NDArray[np.int64] | None) -> None:
    if keys is not None:
        raise UnsupportedFeatureError(f"the {name} backend takes no key lengths")


# --------------------------------------------------------------------------------------------
# FlashInfer ragged prefill


def _flashinfer() -> Any | None:
    if importlib.util.find_spec("flashinfer") is None:
        return None
    try:
        module = importlib.import_module("flashinfer")
        module.BatchPrefillWithRaggedKVCacheWrapper  # noqa: B018 - the API we need
    except (ImportError, AttributeError, RuntimeError, OSError):
        return None
    return module


@dataclass
class _FlashInferPlan:
    wrapper: Any
    cu_seqlens: torch.Tensor
    causal: bool
    planned: tuple[int, int, int] | None = None

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        heads = (q.shape[1], k.shape[1], q.shape[2])
        if self.planned != heads:  # once per forward: every layer has the same heads
            cu = self.cu_seqlens
            self.wrapper.plan(cu, cu, heads[0], heads[1], heads[2], causal=self.causal,
                              q_data_type=q.dtype)  # fmt: skip
            self.planned = heads
        out: torch.Tensor = self.wrapper.run(q, k, v)
        return out

    def windowed(self, window: int) -> AttentionPlan:
        raise UnsupportedFeatureError("the flashinfer backend takes no two-sided window")

    def biased(self, bias: PositionBias) -> AttentionPlan:
        raise UnsupportedFeatureError("the flashinfer backend adds no position bias")


@dataclass
class FlashInferBackend:
    module: Any
    device: torch.device
    name: str = "flashinfer"
    graph_safe: bool = False
    features: frozenset[Feature] = frozenset()
    _workspace: torch.Tensor | None = field(default=None, repr=False)

    def plan(
        self,
        cu_seqlens: torch.Tensor,
        lengths: npt.NDArray[np.int64],
        max_seqlen: int,
        causal: bool,
        keys: npt.NDArray[np.int64] | None = None,
    ) -> AttentionPlan:
        _no_keys(self.name, keys)
        if self._workspace is None:
            self._workspace = torch.empty(128 << 20, dtype=torch.uint8, device=self.device)
        wrapper = self.module.BatchPrefillWithRaggedKVCacheWrapper(self._workspace, "NHD")
        return _FlashInferPlan(wrapper, cu_seqlens, causal)


# --------------------------------------------------------------------------------------------
# grouped SDPA


@dataclass(frozen=True, slots=True)
class _Group:
    batch: int
    length: int
    #: token start when the group's sequences are equal in length and adjacent in the packed
    #: batch (read as a view, no gather), else -1
    start: int
    gather: torch.Tensor | None  # [B * L] token index per padded slot
    scatter_src: torch.Tensor | None  # rows of the padded output that hold real tokens
    scatter_dst: torch.Tensor | None  # their token index in the packed batch
    #: what SDPA takes: None (every key real, or causality hides the padding), the key mask
    #: [B, 1, 1, L], or that combined with a window [B or 1, 1, L, L] or a bias [B or 1, H, L, L]
    mask: torch.Tensor | None


@dataclass(frozen=True, slots=True)
class _GroupedPlan:
    groups: tuple[_Group, ...]
    causal: bool
    total: int
    #: the host lengths and the planning knobs, for the windowed and biased plans made from it
    lengths: npt.NDArray[np.int64]
    device: torch.device
    min_fill: float
    window: int = -1
    bias: PositionBias | None = None
    keys: npt.NDArray[np.int64] | None = None

    def windowed(self, window: int) -> AttentionPlan:
        return _grouped_plan(
            self.lengths, self.device, self.causal, self.min_fill, window, self.bias, self.keys
        )

    def biased(self, bias: PositionBias) -> AttentionPlan:
        return _grouped_plan(
            self.lengths, self.device, self.causal, self.min_fill, self.window, bias, self.keys
        )

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        gqa = q.shape[1] != k.shape[1]
        first = self.groups[0] if self.groups else None
        if first is not None and first.start == 0 and first.batch * first.length == self.total:
            # The whole batch is one run of equal-length sequences: views only, no copies.
            return self._span(first, q, k, v, gqa)
        out = q.new_empty(q.shape)
        for g in self.groups:
            if g.start >= 0:
                out[g.start : g.start + g.batch * g.length] = self._span(g, q, k, v, gqa)
                continue
            assert g.gather is not None
            shape = (g.batch, g.length)
            qg = q.index_select(0, g.gather).view(*shape, *q.shape[1:])
            kg = k.index_select(0, g.gather).view(*shape, *k.shape[1:])
            vg = v.index_select(0, g.gather).view(*shape, *v.shape[1:])
            res = _sdpa(qg, kg, vg, g.mask, self.causal, gqa).flatten(0, 1)
            if g.scatter_src is None:
                assert g.scatter_dst is not None
                out.index_copy_(0, g.scatter_dst, res)
            else:
                assert g.scatter_dst is not None
                out.index_copy_(0, g.scatter_dst, res.index_select(0, g.scatter_src))
        return out

    def _span(
        self, g: _Group, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool
    ) -> torch.Tensor:
        """A group stored contiguously in the packed batch: [B * L] rows viewed as [B, L]."""
        span = slice(g.start, g.start + g.batch * g.length)
        shape = (g.batch, g.length)
        return _sdpa(
            q[span].view(*shape, *q.shape[1:]),
            k[span].view(*shape, *k.shape[1:]),
            v[span].view(*shape, *v.shape[1:]),
            g.mask,
            self.causal,
            gqa,
        ).flatten(0, 1)


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    causal: bool,
    gqa: bool,
) -> torch.Tensor:
    """[B, L, H, D] in and out; SDPA wants heads before length. A mask, when given, already
    holds causality (the key mask of a causal group is never made: right padding is unseen)."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask,
        is_causal=causal and mask is None,
        enable_gqa=gqa,
    )
    return out.transpose(1, 2)


def plan_groups(
    lengths: npt.NDArray[np.int64],
    min_fill: float = 0.8,
    max_group_tokens: int = 16384,
    max_group_scores: int = 0,
) -> list[list[int]]:
    """Sequences (indices, longest first) cut into groups whose padded size stays small.

    A group closes when the next sequence is shorter than `min_fill` of the group's longest, or
    the padded group would exceed `max_group_tokens` (or, when given, `max_group_scores` query-key
    pairs: sequences x longest^2). Empty sequences are left out.
    """
    order = [int(i) for i in np.argsort(-lengths, kind="stable") if lengths[i] > 0]
    groups: list[list[int]] = []
    current: list[int] = []
    top = 0
    for i in order:
        n = int(lengths[i])
        grown = len(current) + 1
        if current and (
            n < min_fill * top
            or grown * top > max_group_tokens
            or 0 < max_group_scores < grown * top * top
        ):
            groups.append(current)
            current = []
        if not current:
            top = n
        current.append(i)
    if current:
        groups.append(current)
    return groups


def _masked(
    keys: torch.Tensor | None,
    length: int,
    device: torch.device,
    causal: bool,
    window: int,
    bias: PositionBias | None,
) -> torch.Tensor | None:
    """A group's SDPA mask: its key mask [B, 1, 1, L] (None: all real) with the window's band
    and the bias's scores folded in (and causality, when a causal group has a key mask); None
    when none of them is asked for."""
    if window < 0 and bias is None and not (causal and keys is not None):
        return keys
    relative = relative_positions(length, device)
    seen = visible(relative, window, causal)[None, None]  # [1, 1, L, L]
    if keys is not None:
        seen = seen & keys
    if bias is None:
        return seen
    scores = bias(relative)[None]  # [1, H, L, L]
    return scores.masked_fill(~seen, float("-inf"))


def _grouped_plan(
    lengths: npt.NDArray[np.int64],
    device: torch.device,
    causal: bool,
    min_fill: float,
    window: int = -1,
    bias: PositionBias | None = None,
    keys: npt.NDArray[np.int64] | None = None,
) -> _GroupedPlan:
    starts = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    groups = []
    # A bias's mask holds heads x L x L scores per sequence: cap what one group holds.
    cap = BIASED_GROUP_SCORES if bias is not None else 0
    for members in plan_groups(lengths, min_fill, max_group_scores=cap):
        lens = lengths[members]
        top = int(lens[0])
        member_starts = starts[members]
        offsets = np.arange(top, dtype=np.int64)
        # Keys cut short of the length: the key mask ends at the prefix, not the length.
        key_lens = lens if keys is None else keys[members]
        cut = bool((key_lens < lens).any())
        if len(members) == 1 or ((lens == top).all() and (np.diff(member_starts) == top).all()):
            # Equal lengths, stored one after another: a view of the packed rows suffices.
            seen = _key_mask(offsets, key_lens, device) if cut else None
            mask = _masked(seen, top, device, causal, window, bias)
            groups.append(_Group(len(members), top, int(member_starts[0]), None, None, None, mask))
            continue
        # Padded slots read the sequence's first token; the mask (or causality) hides them.
        valid = offsets[None, :] < lens[:, None]
        gather = member_starts[:, None] + np.where(valid, offsets[None, :], 0)
        uniform = bool(valid.all())
        src = None if uniform else np.flatnonzero(valid.ravel())
        dst = gather.ravel() if uniform else gather.ravel()[src]
        seen = None
        if cut:
            seen = _key_mask(offsets, key_lens, device)
        elif not uniform and not causal:
            seen = torch.from_numpy(valid[:, None, None, :]).to(device)
        groups.append(
            _Group(
                batch=len(members),
                length=top,
                start=-1,
                gather=torch.from_numpy(gather.ravel()).to(device),
                scatter_src=None if src is None else torch.from_numpy(src).to(device),
                scatter_dst=torch.from_numpy(np.ascontiguousarray(dst)).to(device),
                mask=_masked(seen, top, device, causal, window, bias),
            )
        )
    return _GroupedPlan(
        tuple(groups), causal, int(starts[-1]), lengths, device, min_fill, window, bias, keys
    )


def _key_mask(
    offsets: npt.NDArray[np.int64], keys: npt.NDArray[np.int64], device: torch.device
) -> torch.Tensor:
    """[B, 1, 1, L] bool: True where a slot is one of its sequence's first `keys` tokens."""
    return torch.from_numpy((offsets[None, :] < keys[:, None])[:, None, None, :]).to(device)


@dataclass(frozen=True, slots=True)
class GroupedBackend:
    name: str = "torch-grouped"
    graph_safe: bool = False
    min_fill: float = 0.8
    features: frozenset[Feature] = FEATURES

    def plan(
        self,
        cu_seqlens: torch.Tensor,
        lengths: npt.NDArray[np.int64],
        max_seqlen: int,
        causal: bool,
        keys: npt.NDArray[np.int64] | None = None,
    ) -> AttentionPlan:
        return _grouped_plan(lengths, cu_seqlens.device, causal, self.min_fill, keys=keys)


# --------------------------------------------------------------------------------------------
# selection

BACKEND_NAMES = ("auto", "torch", "flash-attn", "flashinfer")


class BackendUnavailableError(RuntimeError, UnservableError):
    """The requested attention backend cannot run on this device or dtype."""


def available_backends(device: torch.device, dtype: torch.dtype) -> list[AttentionBackend]:
    """What this torch / device / dtype offers, graph-safe varlen kernels first."""
    out: list[AttentionBackend] = []
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        flash = _flash_attn_kernel()
        if flash is not None:
            out.append(VarlenBackend("flash-attn", flash, features=frozenset(["window"])))
        varlen = _torch_varlen_kernel()
        if varlen is not None:
            out.append(VarlenBackend("torch-varlen", varlen[0], features=varlen[1]))
        flashinfer = _flashinfer()
        if flashinfer is not None:
            out.append(FlashInferBackend(flashinfer, device))
    out.append(GroupedBackend())
    return out


@dataclass(frozen=True, slots=True)
class AttentionShape:
    """What the start-up benchmark shapes its batch like: the model's attention heads."""

    heads: int
    kv_heads: int
    head_dim: int
    causal: bool = False


def benchmark_backends(
    backends: Sequence[AttentionBackend],
    device: torch.device,
    dtype: torch.dtype,
    shape: AttentionShape,
    tokens: int = 4096,
    seq: int = 256,
    repeat: int = 5,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Median seconds of one attention call per backend over one ragged batch of `tokens` tokens
    (sequences of `seq` down to `seq`/4 tokens); inf for a backend that fails to run."""
    gen = torch.Generator().manual_seed(0)
    lengths = np.array(
        [max(1, seq - (i % 4) * seq // 4) for i in range(max(1, tokens // seq))], np.int64
    )
    total = int(lengths.sum())
    cu_host = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=cu_host[1:])
    cu = torch.from_numpy(cu_host.astype(np.int32)).to(device)

    def rand(heads: int) -> torch.Tensor:
        return torch.randn((total, heads, shape.head_dim), generator=gen).to(device, dtype)

    q, k, v = rand(shape.heads), rand(shape.kv_heads), rand(shape.kv_heads)
    out: dict[str, float] = {}
    for backend in backends:
        try:
            plan = backend.plan(cu, lengths, int(lengths.max()), shape.causal)
            for _ in range(2):
                plan.attend(q, k, v)
            times = []
            for _ in range(repeat):
                _sync(device)
                start = clock()
                plan.attend(q, k, v)
                _sync(device)
                times.append(clock() - start)
            out[backend.name] = statistics.median(times)
        except Exception:  # a backend that cannot run this shape loses, it does not crash
            log.warning("attention backend %s failed its benchmark", backend.name, exc_info=True)
            out[backend.name] = math.inf
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fastest(timings: Mapping[str, float], order: Sequence[str]) -> str:
    """The quickest backend; ties and all-failed go to the earlier one in `order`."""
    finite = {name: t for name, t in timings.items() if math.isfinite(t)}
    if not finite:
        return order[0]
    return min(order, key=lambda name: (finite.get(name, math.inf), order.index(name)))


def select_backend(
    choice: str,
    device: torch.device,
    dtype: torch.dtype,
    shape: AttentionShape | None = None,
    graphs: bool = False,
    features: frozenset[Feature] = frozenset(),
) -> AttentionBackend:
    """`auto`: the fastest available by a micro-benchmark when `shape` is given and there is a
    choice (graph-safe ones only when `graphs` and one exists), else the first; `torch`: torch's
    own kernels; `flash-attn` / `flashinfer`: that package. Only backends offering the model's
    `features` (a window, a position bias) are considered."""
    offered = available_backends(device, dtype)
    options = [b for b in offered if features <= b.features]
    if choice == "auto":
        candidates = [b for b in options if b.graph_safe] if graphs else []
        candidates = candidates or options
        if shape is None or len(candidates) == 1:
            return candidates[0]
        timings = benchmark_backends(candidates, device, dtype, shape)
        names = [b.name for b in candidates]
        best = fastest(timings, names)
        log.info(
            "attention backend chosen by benchmark",
            extra={"attention": best, "seconds": {n: round(t, 7) for n, t in timings.items()}},
        )
        return next(b for b in candidates if b.name == best)
    if choice == "torch":
        return next(b for b in options if b.name.startswith("torch"))
    if choice in ("flash-attn", "flashinfer"):
        for b in offered:
            if b.name == choice and b in options:
                return b
            if b.name == choice:
                missing = ", ".join(sorted(features - b.features))
                raise BackendUnavailableError(
                    f"{choice} cannot run this model's attention ({missing})"
                )
        raise BackendUnavailableError(
            f"{choice} is not importable or cannot run on {device} with {dtype}"
        )
    raise BackendUnavailableError(
        f"unknown attention backend {choice!r}; use one of {BACKEND_NAMES}"
    )
