"""Random-weight checkpoints of the model families embedfleet serves, and `transformers` references.

There is no model hub here, so each checkpoint is built from the published config of a real model
(hyperparameters as the model's config.json gives them, shrunk in depth and width for CPU speed,
structure kept: position offsets, tied or untied heads, label maps, problem types), saved by
`transformers` itself, next to a tokenizer trained here with `tokenizers` in the family's style
(WordPiece for BERT, Unigram for XLM-R/RoBERTa, byte-level BPE for Qwen3). The references run the
`transformers` model on padded batches, as users of those models do. Needs torch, transformers and
tokenizers (the dev environment), imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

#: prose the tokenizers are trained on; also what the tests send
TEXTS = (
    "What is the capital of France?",
    "Paris is the capital and most populous city of France, on the river Seine.",
    "The quick brown fox jumps over the lazy dog near the bank of the river.",
    "Embeddings map text to vectors so that similar meanings land close together.",
    "A reranker reads the query and the document together and judges their relevance.",
    "Sparse lexical vectors keep one weight per vocabulary word for hybrid search.",
    "Stock prices fell sharply after the company reported weaker quarterly earnings.",
    "I am so grateful for your help, this made my day!",
    "Berlin is the capital of Germany.",
    "The weather today is cold and rainy with strong winds.",
)
#: the Qwen3-Reranker prompt words, so that its frame and answer tokens exist in the vocabulary
_JUDGE_WORDS = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".\n'
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: \n<Document>: \nsystem\nuser\nassistant\n"
)
GO_EMOTIONS = (
    "admiration", "amusement", "anger", "annoyance", "approval", "caring", "confusion",
    "curiosity", "desire", "disappointment", "disapproval", "disgust", "embarrassment",
    "excitement", "fear", "gratitude", "grief", "joy", "love", "nervousness", "optimism",
    "pride", "realization", "relief", "remorse", "sadness", "surprise", "neutral",
)  # fmt: skip


def _corpus() -> list[str]:
    return [*TEXTS, _JUDGE_WORDS, *(["yes no"] * 50)] * 4


def wordpiece_tokenizer(vocab_size: int = 400) -> Tokenizer:
    """BERT's layout: [PAD] 0, [UNK], [CLS], [SEP], [MASK]; pairs as [CLS] a [SEP] b [SEP]."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        _corpus(), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    )
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def unigram_tokenizer(vocab_size: int = 400) -> Tokenizer:
    """XLM-R's (and RoBERTa's) layout: <s> 0, <pad> 1, </s> 2, <unk> 3; pairs as
    <s> a </s></s> b </s>, all type id 0."""
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>"
    )
    tok.train_from_iterator(_corpus(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tok


def qwen_tokenizer(vocab_size: int = 600) -> Tokenizer:
    """Byte-level BPE with Qwen's chat special tokens; "yes" and "no" are single tokens."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    for word in ("yes", "no"):
        if tok.token_to_id(word) is None:
            raise AssertionError(f"{word!r} is not one token of the trained tokenizer")
    return tok


def _save(model: Any, tok: Tokenizer, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.eval().save_pretrained(str(path))
    tok.save(str(path / "tokenizer.json"))
    return path


def _seed(seed: int) -> None:
    import torch

    torch.manual_seed(seed)


# ---- the families -------------------------------------------------------------------------------

#: published XLMRobertaConfig values of BAAI/bge-reranker-base and -v2-m3, then shrunk
XLMR_RERANKERS: dict[str, dict[str, Any]] = {
    "bge-reranker-base": {"max_position_embeddings": 514},  # 12 x 768 in the original
    "bge-reranker-v2-m3": {"max_position_embeddings": 8194},  # 24 x 1024 in the original
}


def xlmr_reranker(path: Path, published: str = "bge-reranker-base", seed: int = 0) -> Path:
    """XLMRobertaForSequenceClassification with one label, bge-reranker's structure."""
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    tok = unigram_tokenizer()
    config = XLMRobertaConfig(
        vocab_size=tok.get_vocab_size(),  # 250002 in the original
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        hidden_act="gelu",
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        num_labels=1,
        architectures=["XLMRobertaForSequenceClassification"],
        initializer_range=0.1,  # wider than 0.02, so that random scores differ visibly
        **XLMR_RERANKERS[published],
    )  # type: ignore[call-arg]
    _seed(seed)
    return _save(XLMRobertaForSequenceClassification(config), tok, path)


#: published Qwen3Config values of Qwen/Qwen3-Reranker-0.6B (tied) and -8B (untied), shrunk with
#: the same query/key-value head ratio
QWEN3_RERANKERS: dict[str, dict[str, Any]] = {
    # 28 x 1024, 16 heads / 8 kv heads, head_dim 128, tied embeddings
    "Qwen3-Reranker-0.6B": {"num_attention_heads": 4, "num_key_value_heads": 2,
                            "tie_word_embeddings": True},
    # 36 x 4096, 32 heads / 8 kv heads, head_dim 128, separate lm_head
    "Qwen3-Reranker-8B": {"num_attention_heads": 4, "num_key_value_heads": 1,
                          "tie_word_embeddings": False},
}  # fmt: skip


def qwen3_reranker(path: Path, published: str = "Qwen3-Reranker-0.6B", seed: int = 0) -> Path:
    """Qwen3ForCausalLM as Qwen3-Reranker ships it; the directory is named after the model."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = qwen_tokenizer()
    config = Qwen3Config(
        vocab_size=tok.get_vocab_size() + 8,  # the original too has ids past its tokenizer's
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=2,
        head_dim=16,
        max_position_embeddings=40960,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        rms_norm_eps=1e-6,
        hidden_act="silu",
        attention_bias=False,
        bos_token_id=tok.token_to_id("<|endoftext|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
        architectures=["Qwen3ForCausalLM"],
        initializer_range=0.1,
        **QWEN3_RERANKERS[published],
    )
    _seed(seed)
    return _save(Qwen3ForCausalLM(config), tok, path / published)


def splade(path: Path, seed: int = 0) -> Path:
    """BertForMaskedLM with naver/splade-cocondenser-ensembledistil's (bert-base) structure."""
    from transformers import BertConfig, BertForMaskedLM

    tok = wordpiece_tokenizer()
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),  # 30522 in the original
        hidden_size=64,  # 12 x 768 in the original
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=512,
        type_vocab_size=2,
        hidden_act="gelu",
        layer_norm_eps=1e-12,
        pad_token_id=0,
        architectures=["BertForMaskedLM"],
        initializer_range=0.1,
    )
    _seed(seed)
    return _save(BertForMaskedLM(config), tok, path)


def finbert(path: Path, seed: int = 0) -> Path:
    """BertForSequenceClassification with ProsusAI/finbert's three labels (softmax)."""
    from transformers import BertConfig, BertForSequenceClassification

    tok = wordpiece_tokenizer()
    config = BertConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=512,
        id2label={0: "positive", 1: "negative", 2: "neutral"},
        label2id={"positive": 0, "negative": 1, "neutral": 2},
        architectures=["BertForSequenceClassification"],
        initializer_range=0.1,
    )
    _seed(seed)
    return _save(BertForSequenceClassification(config), tok, path)


def go_emotions(path: Path, seed: int = 0) -> Path:
    """RobertaForSequenceClassification with SamLowe/roberta-base-go_emotions' 28 labels and its
    multi_label_classification problem type (sigmoid per label)."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    tok = unigram_tokenizer()
    config = RobertaConfig(
        vocab_size=tok.get_vocab_size(),  # 50265 in the original
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        max_position_embeddings=514,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        id2label=dict(enumerate(GO_EMOTIONS)),
        label2id={name: i for i, name in enumerate(GO_EMOTIONS)},
        problem_type="multi_label_classification",
        architectures=["RobertaForSequenceClassification"],
        initializer_range=0.1,
    )
    _seed(seed)
    return _save(RobertaForSequenceClassification(config), tok, path)


# ---- references ---------------------------------------------------------------------------------

Ids = Sequence[Sequence[int]]


def _padded(seqs: Ids, pad: int, left: bool = False) -> tuple[Any, Any]:
    import torch

    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        span = slice(width - len(s), width) if left else slice(0, len(s))
        ids[i, span] = torch.tensor(list(s))
        mask[i, span] = 1
    return ids, mask


def classifier_logits(path: Path, seqs: Ids, types: Ids | None = None) -> npt.NDArray[np.float32]:
    """AutoModelForSequenceClassification's logits [n, labels] on one right-padded batch."""
    import torch
    from transformers import AutoConfig, AutoModelForSequenceClassification

    pad = int(AutoConfig.from_pretrained(str(path)).pad_token_id or 0)
    model = AutoModelForSequenceClassification.from_pretrained(str(path)).eval()
    ids, mask = _padded(seqs, pad)
    extra = {}
    if types is not None:
        extra["token_type_ids"] = _padded(types, 0)[0]
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask, **extra).logits
    return np.asarray(logits.float().numpy(), np.float32)


def splade_vectors(path: Path, seqs: Ids) -> npt.NDArray[np.float32]:
    """SPLADE as naver's and sentence-transformers' code computes it: max over the masked tokens
    of log(1 + relu(MLM logits)), [n, vocab]."""
    import torch
    from transformers import AutoModelForMaskedLM

    model = AutoModelForMaskedLM.from_pretrained(str(path)).eval()
    ids, mask = _padded(seqs, 0)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits
        weights = torch.log1p(torch.relu(logits)) * mask.unsqueeze(-1)
        vectors = weights.max(dim=1).values
    return np.asarray(vectors.numpy(), np.float32)


def qwen3_reranker_scores(
    path: Path, pairs: Sequence[tuple[str, str]], instruction: str | None = None
) -> npt.NDArray[np.float32]:
    """The Qwen3-Reranker model card's own scoring code: its prompt, left padding, full
    next-token logits at the last position, log-softmax over [no, yes], exp of yes."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))  # type: ignore[no-untyped-call]
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()  # type: ignore[no-untyped-call]
    token_false_id = tokenizer.convert_tokens_to_ids("no")
    token_true_id = tokenizer.convert_tokens_to_ids("yes")
    prefix = (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the "
        'Query and the Instruct provided. Note that the answer can only be "yes" or "no".'
        "<|im_end|>\n<|im_start|>user\n"
    )
    suffix = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    prefix_tokens = tokenizer.encode(prefix, add_special_tokens=False)
    suffix_tokens = tokenizer.encode(suffix, add_special_tokens=False)
    task = instruction or (
        "Given a web search query, retrieve relevant passages that answer the query"
    )
    texts = [f"<Instruct>: {task}\n<Query>: {q}\n<Document>: {d}" for q, d in pairs]
    bodies = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    seqs = [prefix_tokens + b + suffix_tokens for b in bodies]
    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert isinstance(pad, int)
    ids, mask = _padded(seqs, pad, left=True)
    with torch.inference_mode():
        batch_scores = model(input_ids=ids, attention_mask=mask).logits[:, -1, :]
        true_vector = batch_scores[:, token_true_id]
        false_vector = batch_scores[:, token_false_id]
        stacked = torch.stack([false_vector, true_vector], dim=1)
        scores = torch.nn.functional.log_softmax(stacked, dim=1)[:, 1].exp()
    return np.asarray(scores.float().numpy(), np.float32)


#: every family's builder, by the name of the model whose config it follows
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "bge-reranker-base": lambda p: xlmr_reranker(p, "bge-reranker-base"),
    "bge-reranker-v2-m3": lambda p: xlmr_reranker(p, "bge-reranker-v2-m3"),
    "Qwen3-Reranker-0.6B": lambda p: qwen3_reranker(p, "Qwen3-Reranker-0.6B"),
    "Qwen3-Reranker-8B": lambda p: qwen3_reranker(p, "Qwen3-Reranker-8B"),
    "splade": splade,
    "finbert": finbert,
    "go_emotions": go_emotions,
}


class FamilyDirs:
    """Model directories under `root`, each built on first use (a session fixture holds one)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._built: dict[str, Path] = {}

    def get(self, name: str) -> Path:
        if name not in self._built:
            self._built[name] = BUILDERS[name](self.root / name)
        return self._built[name]
