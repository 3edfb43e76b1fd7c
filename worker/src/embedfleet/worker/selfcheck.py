"""The start-up self-check: fixed texts through the serving path, compared with a reference.

Where the reference comes from, best first:
1. Vectors computed once with sentence-transformers and committed (selfcheck_reference.json),
   keyed by the SHA-256 of the weights file. This is an independent implementation, so it catches
   what a self-comparison cannot: a weight loaded into the wrong slot, a wrong pooling, a dtype
   that drifted. It covers the bundled MiniLM (and any model someone adds with `--write`).
2. For other models, the engine's own float32 eager CPU path (`reference_outputs`): that still
   catches divergence of the served path (bf16, CUDA graphs, ragged batching) from plain fp32.
3. Otherwise only batch invariance (each text alone equals the texts batched together).

The served batch goes through the serving path ROUNDS times: with lazy CUDA graphs its bucket runs
eager, is captured (and that capture checked against eager by the engine), then replays, so the
vectors a graph serves are compared with the reference too, not only the first, eager, run.

Regenerate the committed file with `python -m embedfleet.worker.selfcheck --write`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from embedfleet.common.arrays import FloatArray
from embedfleet.common.codec import Tokens
from embedfleet.common.modeldir import ModelDir, load_model_dir, resolve_model_path
from embedfleet.common.similarity import min_cosine
from embedfleet.worker.contract import WorkItem

log = logging.getLogger(__name__)

REFERENCE_FILE = Path(__file__).with_name("selfcheck_reference.json")
MIN_COSINE = 0.999  # the "within 0.1% cosine"
#: eager run, capture, replay: a lazy graph's whole life for the self-check's bucket
ROUNDS = 3

#: Mixed lengths (a few tokens to ~150) so packing, position ids and pooling all get exercised.
TEXTS = (
    "Hello world.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch.",
    "Embedding models map text to vectors whose cosine similarity reflects meaning; serving them "
    "well is mostly about keeping the accelerator busy with tightly packed batches of tokens.",
    " ".join(
        f"Sentence {i} of a longer passage talks about rivers, mountains and the weather in spring."
        for i in range(8)
    ),
)

Submit = Callable[[WorkItem], Awaitable[FloatArray]]
ReferenceFn = Callable[[list[WorkItem]], list[FloatArray]]


class SelfCheckError(RuntimeError):
    """The served embeddings disagree with the reference; the worker must not become ready."""


@dataclass(frozen=True)
class SelfCheckResult:
    source: str
    min_cosine: float
    skipped: bool = False


def weights_digest(path: Path) -> str:
    """SHA-256 over the weights files, in name order (about 0.2 s for MiniLM's 90 MB)."""
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    digest = hashlib.sha256()
    for file in files:
        with file.open("rb") as fh:
            while chunk := fh.read(1 << 22):
                digest.update(chunk)
    return digest.hexdigest()


def tokenize(model: ModelDir, texts: Sequence[str]) -> list[list[int]]:
    tokenizer = model.tokenizer()
    return [list(enc.ids) for enc in tokenizer.encode_batch(list(texts))]


def item_of(ids: Sequence[int]) -> WorkItem:
    arr = np.asarray(ids, dtype=np.int32)
    return WorkItem(Tokens(ids=arr, lengths=np.asarray([arr.size], dtype=np.int32)))


def load_reference(digest: str, file: Path = REFERENCE_FILE) -> dict[str, Any] | None:
    if not file.is_file():
        return None
    entry = json.loads(file.read_text()).get(digest)
    return entry if isinstance(entry, dict) else None


def reference_outputs(
    model: str, items: list[WorkItem], max_input_tokens: int = 0
) -> list[FloatArray]:
    """Outputs of a float32, eager, CPU engine for `items`: the yardstick for uncommitted models."""
    # Imported here: torch loads only when a real engine is checked, never for the null engine.
    from embedfleet.worker.engine.config import EngineConfig
    from embedfleet.worker.engine.torch_engine import TorchEngine

    engine = TorchEngine(
        EngineConfig(
            model=model,
            max_input_tokens=max_input_tokens,
            device="cpu",
            dtype="float32",
            cpu_runtime="eager",
            cuda_graphs="off",
        )
    )
    return engine.run(items)


async def _served(submit: Submit, token_ids: Sequence[Sequence[int]]) -> FloatArray:
    # Concurrent submits so the texts share one batch, as real traffic does.
    rows = await asyncio.gather(*(submit(item_of(ids)) for ids in token_ids))
    return np.concatenate([np.asarray(r, dtype=np.float32) for r in rows])


async def run_selfcheck(
    submit: Submit,
    model: ModelDir,
    reference_fn: ReferenceFn | None = None,
    reference_file: Path = REFERENCE_FILE,
    rounds: int = ROUNDS,
) -> SelfCheckResult:
    """Raise SelfCheckError unless every round's served vectors are within MIN_COSINE of the
    reference."""
    if model.task != "embed":
        # Rerankers, classifiers and SPLADE have no dense reference vectors; their parity with
        # transformers lives in the engine's tests (test_engine_heads.py).
        return SelfCheckResult(f"none ({model.task} model)", 1.0, skipped=True)
    digest = await asyncio.to_thread(weights_digest, model.path)
    stored = load_reference(digest, reference_file)
    if stored is not None:
        token_ids: list[list[int]] = stored["token_ids"]
        expected = np.asarray(stored["embeddings"], dtype=np.float64)
        source = "sentence-transformers (committed)"
    else:
        token_ids = tokenize(model, TEXTS)
        if reference_fn is not None:
            items = [item_of(ids) for ids in token_ids]
            rows = await asyncio.to_thread(reference_fn, items)
            expected = np.concatenate([np.asarray(r, np.float64) for r in rows])
            source = "engine fp32 eager"
        else:
            alone = [await submit(item_of(ids)) for ids in token_ids]
            expected = np.concatenate([np.asarray(r, np.float64) for r in alone])
            source = "batch invariance only (no reference for this model)"
    worst = 1.0
    for turn in range(rounds):
        served = await _served(submit, token_ids)
        if not np.all(np.isfinite(served)):
            raise SelfCheckError(f"round {turn + 1}: served embeddings hold non-finite values")
        if served.shape != expected.shape:
            raise SelfCheckError(f"served shape {served.shape} != reference {expected.shape}")
        cos = min_cosine(served, expected)
        if cos < MIN_COSINE:
            raise SelfCheckError(
                f"round {turn + 1}: min cosine {cos:.6f} < {MIN_COSINE} against {source}"
            )
        worst = min(worst, cos)
    return SelfCheckResult(source, worst)


def write_reference(model_path: Path, file: Path = REFERENCE_FILE) -> str:
    """Compute and store sentence-transformers vectors for TEXTS (needs the dev dependencies)."""
    import sentence_transformers
    from sentence_transformers import SentenceTransformer

    model = load_model_dir(model_path)
    st = SentenceTransformer(str(model_path), device="cpu")
    token_ids = tokenize(model, TEXTS)
    for ids, text in zip(token_ids, TEXTS, strict=True):
        st_ids = st.tokenize([text])["input_ids"][0].tolist()
        if st_ids != ids:
            raise RuntimeError("the raw tokenizer and sentence-transformers disagree")
    vectors = st.encode(list(TEXTS), convert_to_numpy=True, normalize_embeddings=False)
    digest = weights_digest(model_path)
    data = json.loads(file.read_text()) if file.is_file() else {}
    data[digest] = {
        "model": model.name,
        "source": f"sentence-transformers {sentence_transformers.__version__}",
        "texts": list(TEXTS),
        "token_ids": token_ids,
        "embeddings": [[round(float(x), 7) for x in row] for row in vectors],
    }
    file.write_text(json.dumps(data, indent=1) + "\n")
    return digest


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help="(re)compute the committed reference")
    parser.add_argument("--model", default="", help="model directory (default: bundled MiniLM)")
    args = parser.parse_args(argv)
    path = resolve_model_path(args.model)
    if args.write:
        print(f"wrote reference for {path} ({write_reference(path)[:12]}...) to {REFERENCE_FILE}")
    else:
        digest = weights_digest(path)
        found = load_reference(digest) is not None
        print(f"{path}: digest {digest[:12]}..., committed reference: {found}")


if __name__ == "__main__":
    main()
