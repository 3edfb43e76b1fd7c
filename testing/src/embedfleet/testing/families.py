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

import functools
import json
import shutil
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


def _wordpiece(specials: list[str], unk: str, vocab_size: int) -> Tokenizer:
    """BERT's normalizer, pre-tokenizer and WordPiece, trained here; no post-processor yet."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        _corpus(), trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
    )
    return tok


def wordpiece_tokenizer(vocab_size: int = 400) -> Tokenizer:
    """BERT's layout: [PAD] 0, [UNK], [CLS], [SEP], [MASK]; pairs as [CLS] a [SEP] b [SEP]."""
    tok = _wordpiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[UNK]", vocab_size)
    return _bert_template(tok, "[CLS] $A [SEP] $B:1 [SEP]:1")


def _bert_template(tok: Tokenizer, pair: str) -> Tokenizer:
    """[CLS] a [SEP] around one sequence, `pair` around two."""
    from tokenizers import processors

    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair=pair, special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return tok


def unigram_tokenizer(vocab_size: int = 400) -> Tokenizer:
    """XLM-R's layout: <s> 0, <pad> 1, </s> 2, <unk> 3; pairs as
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


def _byte_bpe(specials: list[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2's alphabet) trained here, `specials` first; no post-processor."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(_corpus(), trainer)
    return tok


def roberta_tokenizer(vocab_size: int = 500) -> Tokenizer:
    """RoBERTa's layout: byte-level BPE, <s> 0, <pad> 1, </s> 2, <unk> 3; pairs as
    <s> a </s></s> b </s> (a unigram one would be read as BPE by `transformers`' class)."""
    from tokenizers import processors

    tok = _byte_bpe(["<s>", "<pad>", "</s>", "<unk>", "<mask>"], vocab_size)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", 0), ("</s>", 2)],
    )
    return tok


def qwen_tokenizer(vocab_size: int = 600) -> Tokenizer:
    """Byte-level BPE with Qwen's chat special tokens; "yes" and "no" are single tokens."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tok = _byte_bpe(specials, vocab_size)
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


def _xlmr_config(tok: Tokenizer, **changes: Any) -> Any:
    """XLMRobertaConfig at 2 x 64 with 4 heads for `tok`'s vocabulary (250002 in bge-m3 and
    bge-reranker-v2-m3, 24 x 1024), weights wider than 0.02 so that random outputs differ
    visibly."""
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=tok.get_vocab_size(),
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
        initializer_range=0.1,
        **changes,
    )


def xlmr_reranker(path: Path, published: str = "bge-reranker-base", seed: int = 0) -> Path:
    """XLMRobertaForSequenceClassification with one label, bge-reranker's structure."""
    from transformers import XLMRobertaForSequenceClassification

    tok = unigram_tokenizer()
    config = _xlmr_config(
        tok,
        num_labels=1,
        architectures=["XLMRobertaForSequenceClassification"],
        **XLMR_RERANKERS[published],
    )
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


def bge_m3(path: Path, seed: int = 0) -> Path:
    """XLMRobertaModel with BAAI/bge-m3's structure and its two extra heads as its repository
    ships them: state dicts of a torch.nn.Linear(hidden, hidden) in colbert_linear.pt (ColBERT)
    and a torch.nn.Linear(hidden, 1) in sparse_linear.pt (lexical weights), and the special
    tokens its tokenizer_config.json names."""
    import torch
    from transformers import XLMRobertaModel

    tok = unigram_tokenizer()
    config = _xlmr_config(tok, max_position_embeddings=8194, architectures=["XLMRobertaModel"])
    _seed(seed)
    _save(XLMRobertaModel(config, add_pooling_layer=False), tok, path)
    torch.save(torch.nn.Linear(64, 64).state_dict(), str(path / "colbert_linear.pt"))
    torch.save(torch.nn.Linear(64, 1).state_dict(), str(path / "sparse_linear.pt"))
    specials = {"cls_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    (path / "tokenizer_config.json").write_text(json.dumps(specials), encoding="utf-8")
    return path


def bge_m3_colbert(path: Path, seqs: Ids) -> list[npt.NDArray[np.float32]]:
    """bge-m3's colbert vectors as its own code makes them: the last hidden state without the
    first (CLS) token, through colbert_linear, L2-normalized per token; one [len - 1, D] array
    per sequence, padding left out."""
    import torch
    from transformers import XLMRobertaModel

    model = XLMRobertaModel.from_pretrained(str(path), add_pooling_layer=False)
    model.eval()  # type: ignore[no-untyped-call]
    linear = torch.nn.Linear(64, 64)
    linear.load_state_dict(torch.load(str(path / "colbert_linear.pt"), weights_only=True))
    ids, mask = _padded(seqs, 1)
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        vectors = torch.nn.functional.normalize(linear(hidden[:, 1:]), dim=-1)
    return [np.asarray(vectors[i, : len(s) - 1].numpy(), np.float32) for i, s in enumerate(seqs)]


def bge_m3_dense(path: Path, seqs: Ids) -> npt.NDArray[np.float32]:
    """bge-m3's dense vectors before its Normalize module: each sequence's first (CLS) token's
    last hidden state, [N, hidden]."""
    import torch
    from transformers import XLMRobertaModel

    model = XLMRobertaModel.from_pretrained(str(path), add_pooling_layer=False)
    model.eval()  # type: ignore[no-untyped-call]
    ids, mask = _padded(seqs, 1)
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    return np.asarray(hidden[:, 0].numpy(), np.float32)


def bge_m3_lexical(path: Path, seqs: Ids) -> list[dict[int, float]]:
    """bge-m3's lexical weights as FlagEmbedding's rule makes them, {token id: weight} per
    sequence: ReLU(sparse_linear(last hidden state)) a token, the largest per id, the cls, eos,
    pad and unk tokens and zero weights left out."""
    import torch
    from transformers import XLMRobertaModel

    model = XLMRobertaModel.from_pretrained(str(path), add_pooling_layer=False)
    model.eval()  # type: ignore[no-untyped-call]
    linear = torch.nn.Linear(64, 1)
    linear.load_state_dict(torch.load(str(path / "sparse_linear.pt"), weights_only=True))
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    unused = {tok.token_to_id(t) for t in ("<s>", "</s>", "<pad>", "<unk>")}
    ids, mask = _padded(seqs, 1)
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        weights = torch.relu(linear(hidden)).squeeze(-1)
    out: list[dict[int, float]] = []
    for i, s in enumerate(seqs):
        kept: dict[int, float] = {}
        for token, weight in zip(s, weights[i, : len(s)].tolist(), strict=True):
            if token not in unused and weight > kept.get(token, 0.0):
                kept[token] = weight
        out.append(kept)
    return out


def pylate_colbert_vectors(
    path: Path, seqs: Ids, keys: Sequence[int] | None = None
) -> list[npt.NDArray[np.float32]]:
    """A PyLate ColBERT's token vectors as its modules compute them: the last hidden state of
    every token through the Dense module's linear map, L2-normalized (its skip-list left out).
    `keys`: each sequence's tokens the others attend to, its first ones (PyLate's attention mask
    zeroed on query expansion tokens when `attend_to_expansion_tokens` is false); None: all."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path))
    model.eval()
    weight = load_file(str(path / "1_Dense" / "model.safetensors"))["linear.weight"]
    ids, mask = _padded(seqs, 0)
    for i, k in enumerate(keys or ()):
        mask[i, k:] = 0
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
        vectors = torch.nn.functional.normalize(hidden @ weight.T, dim=-1)
    return [np.asarray(vectors[i, : len(s)].numpy(), np.float32) for i, s in enumerate(seqs)]


def small_bert(tok: Tokenizer) -> dict[str, Any]:
    """BERT at 2 x 64 with 4 heads for `tok`'s vocabulary, weights wide enough to tell apart."""
    return {
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 256,
        "max_position_embeddings": 512,
        "initializer_range": 0.1,
    }


def finbert(path: Path, seed: int = 0) -> Path:
    """BertForSequenceClassification with ProsusAI/finbert's three labels (softmax)."""
    from transformers import BertConfig, BertForSequenceClassification

    tok = wordpiece_tokenizer()
    config = BertConfig(
        **small_bert(tok),
        id2label={0: "positive", 1: "negative", 2: "neutral"},
        label2id={"positive": 0, "negative": 1, "neutral": 2},
        architectures=["BertForSequenceClassification"],
    )
    _seed(seed)
    return _save(BertForSequenceClassification(config), tok, path)


def go_emotions(path: Path, seed: int = 0) -> Path:
    """RobertaForSequenceClassification with SamLowe/roberta-base-go_emotions' 28 labels and its
    multi_label_classification problem type (sigmoid per label)."""
    from transformers import RobertaConfig, RobertaForSequenceClassification

    tok = roberta_tokenizer()
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


# ---- decoder embedders --------------------------------------------------------------------------


def metaspace_tokenizer(specials: Sequence[str], bos: str, vocab_size: int = 600) -> Tokenizer:
    """SentencePiece-style BPE (Mistral's and Gemma's layout): `specials` first, in their ids'
    order, and `bos` before every sequence."""
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(
        _corpus(), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials))
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return tok


def gemma_tokenizer(specials: Sequence[str], bos: str, vocab_size: int = 600) -> Tokenizer:
    """Gemma's layout, which `transformers`' GemmaTokenizer rebuilds from the file's vocabulary
    and merges whatever the file's pipeline says: spaces normalized to "▁" and no split between
    words, BPE with byte fallback, `bos` before every sequence. A Metaspace tokenizer would be
    served as its file says and read by `transformers` another way."""
    from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

    unk = next(s for s in specials if "unk" in s)
    tok = Tokenizer(models.BPE(unk_token=unk, fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    tok.train_from_iterator(
        _corpus(), trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials))
    )
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.token_to_id(bos))]
    )
    return tok


#: published configs of decoder embedders: hidden sizes, query / key-value heads, head dims,
#: rotary bases, windows and norms of the named checkpoints; two layers deep, MLPs narrowed to
#: 2048 (the 7B ones' 14336-18944 wide MLPs would be most of a CPU test's time), vocabularies
#: trained here (the published 32k-262k rows change only the embedding table's size)
DECODERS: dict[str, dict[str, Any]] = {
    # Alibaba-NLP/gte-Qwen2-1.5B-instruct: Qwen2 (QKV biases), last token
    "gte-Qwen2-1.5B-instruct": {"model_type": "qwen2", "hidden_size": 1536,
        "num_attention_heads": 12, "num_key_value_heads": 2, "rope_theta": 1_000_000.0,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6},
    # Alibaba-NLP/gte-Qwen2-7B-instruct: 28 query heads over 4 key-value heads
    "gte-Qwen2-7B-instruct": {"model_type": "qwen2", "hidden_size": 3584,
        "num_attention_heads": 28, "num_key_value_heads": 4, "rope_theta": 1_000_000.0,
        "max_position_embeddings": 131072, "rms_norm_eps": 1e-6},
    # intfloat/e5-mistral-7b-instruct (and Salesforce/SFR-Embedding-Mistral, the same shape):
    # a causal window of 4096 tokens on every layer
    "e5-mistral-7b-instruct": {"model_type": "mistral", "hidden_size": 4096,
        "num_attention_heads": 32, "num_key_value_heads": 8, "rope_theta": 10_000.0,
        "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "sliding_window": 4096},
    # google/embeddinggemma-300m: bidirectional Gemma3, 3 query heads of 256 over 1, sliding
    # window 512 (W/2 either side), local and global rotary bases, its full 1152-wide MLP
    "embeddinggemma-300m": {"model_type": "gemma3_text", "hidden_size": 768,
        "intermediate_size": 1152, "num_attention_heads": 3, "num_key_value_heads": 1,
        "head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 512,
        "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "use_bidirectional_attention": True,
        "layer_types": ["sliding_attention", "full_attention"]},
    # perplexity-ai/pplx-embed-v1-0.6b: Qwen3-0.6B's shape, bidirectional, mean pooling
    "pplx-embed-v1-0.6b": {"model_type": "qwen3", "hidden_size": 1024,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
        "rope_theta": 1_000_000.0, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
        "is_causal": False},
}  # fmt: skip

#: each family's tokenizer in its own layout (Qwen's byte-level BPE for the others)
_DECODER_TOKENIZERS: dict[str, Callable[[], Tokenizer]] = {
    "mistral": lambda: metaspace_tokenizer(("<unk>", "<s>", "</s>"), "<s>"),
    "gemma3_text": lambda: gemma_tokenizer(("<pad>", "<eos>", "<bos>", "<unk>"), "<bos>"),
}


def decoder_embedder(path: Path, published: str, seed: int = 0, **changes: Any) -> Path:
    """`published`'s decoder as sentence-transformers ships it (`AutoModel` weights,
    last-token pooling, or mean for the bidirectional ones, and Normalize); `changes` override
    the config (a smaller `sliding_window`, so that short tests cross it; the published depth
    and MLP width, `num_hidden_layers` and `intermediate_size`, for a benchmark)."""
    import torch
    from transformers import AutoConfig, AutoModel

    spec = {**DECODERS[published], **changes}
    kind = spec.pop("model_type")
    tok = _DECODER_TOKENIZERS.get(kind, qwen_tokenizer)()
    config = AutoConfig.for_model(
        kind,
        vocab_size=tok.get_vocab_size(),
        intermediate_size=spec.pop("intermediate_size", 2048),
        num_hidden_layers=spec.pop("num_hidden_layers", 2),
        **spec,  # the published initializer_range (0.02): wider makes these widths ill-conditioned
    )
    _seed(seed)
    model = AutoModel.from_config(config)  # type: ignore[no-untyped-call]
    if kind == "gemma3_text":  # its init leaves the (1 + w) norms at w = 0: vary them
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "norm" in name:
                    param.normal_(0.0, 0.1)
    out = _save(model, tok, path / published)
    if kind == "mistral":
        # Mistral's vocabulary has no pad token; its embedders pad with </s>, and without one
        # sentence-transformers cannot batch
        (out / "tokenizer_config.json").write_text(json.dumps({"pad_token": "</s>"}))
    bidirectional = bool(spec.get("use_bidirectional_attention")) or spec.get("is_causal") is False
    return sentence_transformers_modules(out, "mean" if bidirectional else "lasttoken")


def decoder_hidden(path: Path, seqs: Ids, dtype: str = "float32") -> list[Any]:
    """`transformers`' last hidden states [len, H] per sequence, each run alone (no padding):
    AutoModel reads the checkpoint's own attention (is_causal / use_bidirectional_attention,
    sliding windows) from config.json."""
    import torch
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(path), dtype=getattr(torch, dtype)).eval()
    with torch.inference_mode():
        return [model(input_ids=torch.tensor([list(s)])).last_hidden_state[0] for s in seqs]


def decoder_vectors(path: Path, seqs: Ids, mean: bool) -> npt.NDArray[np.float32]:
    """The pooled, normalized reference rows: last token, or mean for bidirectional models."""
    import torch

    rows = [h.float().mean(0) if mean else h[-1].float() for h in decoder_hidden(path, seqs)]
    vectors = torch.nn.functional.normalize(torch.stack(rows), dim=-1)
    return np.asarray(vectors.numpy(), np.float32)


# ---- encoder embedders with sentence-transformers modules ----------------------------------------


def bpe_tokenizer(vocab_size: int = 500) -> Tokenizer:
    """ModernBERT's layout: byte-level BPE with [CLS] a [SEP], BERT-named special tokens."""
    tok = _byte_bpe(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], vocab_size)
    return _bert_template(tok, "[CLS] $A [SEP] $B [SEP]")


def mpnet_tokenizer(vocab_size: int = 400) -> Tokenizer:
    """MPNet's layout: BERT's WordPiece under RoBERTa's specials, <s> 0, <pad> 1, </s> 2."""
    from tokenizers import processors

    tok = _wordpiece(["<s>", "<pad>", "</s>", "[UNK]", "<mask>"], "[UNK]", vocab_size)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    return tok


def _save_tokenizer(tok: Tokenizer, path: Path, pad: str) -> None:
    """tokenizer.json plus what transformers' AutoTokenizer (so sentence-transformers) loads."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=pad)  # type: ignore[no-untyped-call]
    fast.save_pretrained(str(path))


def sentence_transformers_modules(
    path: Path,
    pooling: str | None,
    *,
    dense: Sequence[tuple[int, int, str] | tuple[int, int, str, bool]] = (),
    normalize: bool = True,
    legacy_flags: bool = False,
    prompts: dict[str, str] | None = None,
    max_seq_length: int = 0,
    seed: int = 0,
) -> Path:
    """The files sentence-transformers keeps next to a transformer: modules.json, the Pooling
    config (`pooling_mode`, or the older boolean flags), Dense modules as (in, out, torch.nn
    activation class[, bias: default True]) with random weights, Normalize, prompts and
    max_seq_length. No `pooling`: no Pooling module, the Dense modules straight after the
    transformer (PyLate's ColBERT layout)."""
    import torch
    from safetensors.torch import save_file

    modules: list[dict[str, Any]] = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
    ]

    def add(kind: str) -> Path:
        idx = len(modules)
        folder = f"{idx}_{kind}"
        modules.append(
            {
                "idx": idx,
                "name": str(idx),
                "path": folder,
                "type": f"sentence_transformers.models.{kind}",
            }
        )
        (path / folder).mkdir(exist_ok=True)
        return path / folder

    size = json_of(path / "config.json").get("hidden_size") or json_of(path / "config.json")["dim"]
    pool_cfg: dict[str, Any] = {"embedding_dimension": size, "pooling_mode": pooling}
    if legacy_flags:
        modes = ("cls", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
        flags = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                 "weightedmean_tokens", "lasttoken")  # fmt: skip
        pool_cfg = {"word_embedding_dimension": size}
        pool_cfg.update(
            {f"pooling_mode_{f}": m == pooling for m, f in zip(modes, flags, strict=True)}
        )
    if pooling is not None:
        (add("Pooling") / "config.json").write_text(json.dumps(pool_cfg))
    _seed(seed)
    for n_in, n_out, act, *bias in dense:
        folder = add("Dense")
        has_bias = bool(bias[0]) if bias else True
        config = {"in_features": n_in, "out_features": n_out, "bias": has_bias,
                  "activation_function": f"torch.nn.modules.activation.{act}"}  # fmt: skip
        if act == "Identity":
            config["activation_function"] = "torch.nn.modules.linear.Identity"
        (folder / "config.json").write_text(json.dumps(config))
        weights = {"linear.weight": torch.randn(n_out, n_in) / n_in**0.5}
        if has_bias:
            weights["linear.bias"] = torch.randn(n_out) * 0.1
        save_file(weights, str(folder / "model.safetensors"))
    if normalize:
        add("Normalize")
    (path / "modules.json").write_text(json.dumps(modules))
    if max_seq_length:
        (path / "sentence_bert_config.json").write_text(
            json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
        )
    (path / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": prompts or {}, "default_prompt_name": None})
    )
    return path


def json_of(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


#: published configs (hidden sizes, heads, MLP widths, positions, norms, buckets, windows and
#: rotary bases of the named checkpoints), two to four layers deep, vocabularies trained here
#: sentence-transformers/multi-qa-distilbert-cos-v1 (distilbert-base-uncased)
DISTILBERT: dict[str, Any] = {
    "dim": 768, "n_heads": 12, "hidden_dim": 3072, "n_layers": 2, "activation": "gelu",
    "max_position_embeddings": 512, "sinusoidal_pos_embds": False,
}  # fmt: skip
#: sentence-transformers/all-mpnet-base-v2 (microsoft/mpnet-base)
MPNET: dict[str, Any] = {
    "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072,
    "num_hidden_layers": 2, "max_position_embeddings": 514, "layer_norm_eps": 1e-5,
    "relative_attention_num_buckets": 32, "hidden_act": "gelu", "pad_token_id": 1,
    "bos_token_id": 0, "eos_token_id": 2,
}  # fmt: skip
#: answerdotai/ModernBERT-base (nomic-ai/modernbert-embed-base, Alibaba gte-modernbert-base)
MODERNBERT: dict[str, Any] = {
    "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 1152,
    "num_hidden_layers": 4, "global_attn_every_n_layers": 3, "local_attention": 128,
    "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "max_position_embeddings": 8192,
    "norm_eps": 1e-5, "norm_bias": False, "attention_bias": False, "mlp_bias": False,
    "hidden_activation": "gelu",
}  # fmt: skip


def _embedder(
    path: Path, model: Any, tok: Tokenizer, pad: str, pooling: str | None = "mean", **modules: Any
) -> Path:
    """A transformer saved with its tokenizer (both formats) and sentence-transformers modules."""
    _save(model, tok, path)
    _save_tokenizer(tok, path, pad)
    return sentence_transformers_modules(path, pooling, **modules)


def distilbert(path: Path, seed: int = 0) -> Path:
    """DistilBertModel as multi-qa-distilbert-cos-v1 ships it: mean pooling, normalized."""
    from transformers import DistilBertConfig, DistilBertModel

    tok = wordpiece_tokenizer()
    config = DistilBertConfig(vocab_size=tok.get_vocab_size(), pad_token_id=0, **DISTILBERT)
    _seed(seed)
    return _embedder(path, DistilBertModel(config), tok, "[PAD]", max_seq_length=512)


def mpnet(path: Path, seed: int = 0) -> Path:
    """MPNetModel as all-mpnet-base-v2 ships it: mean pooling, normalized, 384 tokens."""
    from transformers import MPNetConfig, MPNetModel

    tok = mpnet_tokenizer()
    config = MPNetConfig(vocab_size=tok.get_vocab_size(), initializer_range=0.1, **MPNET)
    _seed(seed)
    return _embedder(path, MPNetModel(config), tok, "<pad>", max_seq_length=384)


def modernbert(path: Path, seed: int = 0) -> Path:
    """ModernBertModel as modernbert-embed-base ships it: mean pooling, normalized, with its
    search_query / search_document prompts."""
    from transformers import ModernBertConfig, ModernBertModel

    tok = bpe_tokenizer()
    config = ModernBertConfig(
        vocab_size=tok.get_vocab_size(),
        pad_token_id=tok.token_to_id("[PAD]"),
        cls_token_id=tok.token_to_id("[CLS]"),
        sep_token_id=tok.token_to_id("[SEP]"),
        bos_token_id=tok.token_to_id("[CLS]"),
        eos_token_id=tok.token_to_id("[SEP]"),
        **MODERNBERT,
    )
    prompts = {"query": "search_query: ", "document": "search_document: "}
    _seed(seed)
    return _embedder(
        path, ModernBertModel(config), tok, "[PAD]", prompts=prompts, max_seq_length=8192
    )


def bert_dense(path: Path, pooling: str = "cls", seed: int = 0) -> Path:
    """BertModel with Dense layers after pooling, EmbeddingGemma's shape in small (768 -> 3072
    -> 768, identity activations, no bias) ahead of a LaBSE-style tanh one with a bias, then
    Normalize; the pooling config in the older boolean flags."""
    from transformers import BertConfig, BertModel

    tok = wordpiece_tokenizer()
    config = BertConfig(**small_bert(tok))
    dense = ((64, 256, "Identity", False), (256, 48, "Tanh"))
    _seed(seed)
    model = BertModel(config)
    return _embedder(path, model, tok, "[PAD]", pooling, dense=dense, legacy_flags=True, seed=seed)


def pylate_colbert(path: Path, seed: int = 0) -> Path:
    """BertModel as PyLate saves a ColBERT (answerai-colbert-small-v1: 384 -> 96): a Dense
    module without bias or activation straight after the transformer, no pooling."""
    from transformers import BertConfig, BertModel

    tok = wordpiece_tokenizer()
    _seed(seed)
    model = BertModel(BertConfig(**small_bert(tok)), add_pooling_layer=False)
    dense = ((64, 24, "Identity", False),)
    return _embedder(path, model, tok, "[PAD]", None, dense=dense, normalize=False, seed=seed)


PYLATE_RULES = {
    "query_prefix": "[unused0]",
    "document_prefix": "[unused1]",
    "query_length": 12,
    "document_length": 10,
    "do_query_expansion": True,
    "attend_to_expansion_tokens": True,
    "skiplist_words": [".", ",", "!", "?"],
}


def pylate_colbert_marked(path: Path, seed: int = 0) -> Path:
    """`pylate_colbert` with PyLate's encoding rules in config_sentence_transformers.json: its
    marker tokens in the vocabulary, short query/document lengths so texts get cut, query
    expansion (the expansion tokens attended to; `pylate_unattended` makes a copy where they are
    not, PyLate's default) and a punctuation skip-list."""
    from transformers import BertConfig, BertModel

    tok = wordpiece_tokenizer()
    tok.add_special_tokens(["[unused0]", "[unused1]"])
    _seed(seed)
    model = BertModel(BertConfig(**small_bert(tok)), add_pooling_layer=False)
    dense = ((64, 24, "Identity", False),)
    _embedder(path, model, tok, "[PAD]", None, dense=dense, normalize=False, seed=seed)
    meta = json_of(path / "config_sentence_transformers.json")
    (path / "config_sentence_transformers.json").write_text(json.dumps({**meta, **PYLATE_RULES}))
    # the token query expansion pads with, named as BERT checkpoints name it
    specials = json_of(path / "tokenizer_config.json")
    (path / "tokenizer_config.json").write_text(json.dumps({**specials, "mask_token": "[MASK]"}))
    return path


def pylate_encoded(path: Path, texts: Sequence[str], query: bool) -> list[list[int]]:
    """PyLate's ids of `texts` as a query or document: the tokenizer's ids cut to one less
    than the length (keeping the closing token), the marker after the first token, a query
    padded with the mask token to its length."""
    from tokenizers import Tokenizer

    rules = json_of(path / "config_sentence_transformers.json")
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    side = "query" if query else "document"
    length = int(rules[f"{side}_length"])
    marker, mask = tok.token_to_id(rules[f"{side}_prefix"]), tok.token_to_id("[MASK]")
    assert marker is not None
    assert mask is not None
    out = []
    for text in texts:
        ids = tok.encode(text).ids
        if len(ids) > length - 1:
            ids = [*ids[: length - 2], ids[-1]]
        ids.insert(1, marker)
        if query and rules["do_query_expansion"]:
            ids += [mask] * (length - len(ids))
        out.append(ids)
    return out


def pylate_unattended(marked: Path, path: Path) -> Path:
    """A copy of the `pylate_colbert_marked` directory at `path` whose expansion tokens no
    token attends to (`attend_to_expansion_tokens` false); the same weights."""
    shutil.copytree(marked, path)
    meta = json_of(path / "config_sentence_transformers.json")
    meta["attend_to_expansion_tokens"] = False
    (path / "config_sentence_transformers.json").write_text(json.dumps(meta))
    return path


def pylate_keys(path: Path, seqs: Ids) -> list[int]:
    """Each encoded query's tokens attended to, as PyLate's attention mask has them: all of them,
    or without `attend_to_expansion_tokens` those before the mask tokens padding it."""
    rules = json_of(path / "config_sentence_transformers.json")
    if rules["attend_to_expansion_tokens"]:
        return [len(s) for s in seqs]
    mask = Tokenizer.from_file(str(path / "tokenizer.json")).token_to_id("[MASK]")
    return [len(s) - next((i for i, t in enumerate(reversed(s)) if t != mask), 0) for s in seqs]


def pylate_kept(path: Path, ids: Sequence[int]) -> list[bool]:
    """Which of a document's tokens keep their vectors: those not in PyLate's skip-list."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(path / "tokenizer.json"))
    skip = {
        tok.token_to_id(w)
        for w in json_of(path / "config_sentence_transformers.json")["skiplist_words"]
    }
    return [i not in skip for i in ids]


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


def st_embeddings(
    path: Path, seqs: Ids, batch: int = 8, pooling: str = ""
) -> npt.NDArray[np.float32]:
    """sentence-transformers' modules (transformer, pooling, Dense, Normalize) on right-padded
    batches of `batch` sequences, float32: what its `encode` returns for these token ids;
    `pooling` (a sentence-transformers mode name) replaces the model's own."""
    import torch
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device="cpu")
    for module in model if pooling else ():
        if type(module).__name__ == "Pooling":
            setattr(module, "pooling_mode", pooling)  # noqa: B010 - not a type mypy knows
    pad = model.tokenizer.pad_token_id
    types = "token_type_ids" in model.tokenizer.model_input_names
    out = []
    with torch.inference_mode():
        for start in range(0, len(seqs), batch):
            ids, mask = _padded(seqs[start : start + batch], int(pad or 0))
            features = {"input_ids": ids, "attention_mask": mask}
            if types:
                features["token_type_ids"] = torch.zeros_like(ids)
            out.append(model(features)["sentence_embedding"].float().numpy())
    return np.asarray(np.concatenate(out), np.float32)


#: every family's builder, by the name of the model whose config it follows
BUILDERS: dict[str, Callable[[Path], Path]] = {
    "bge-reranker-base": lambda p: xlmr_reranker(p, "bge-reranker-base"),
    "bge-reranker-v2-m3": lambda p: xlmr_reranker(p, "bge-reranker-v2-m3"),
    "Qwen3-Reranker-0.6B": lambda p: qwen3_reranker(p, "Qwen3-Reranker-0.6B"),
    "Qwen3-Reranker-8B": lambda p: qwen3_reranker(p, "Qwen3-Reranker-8B"),
    "splade": splade,
    "bge-m3": bge_m3,
    "pylate-colbert": pylate_colbert,
    "pylate-colbert-marked": pylate_colbert_marked,
    "finbert": finbert,
    "go_emotions": go_emotions,
    **{name: functools.partial(decoder_embedder, published=name) for name in DECODERS},
    "distilbert": distilbert,
    "mpnet": mpnet,
    "modernbert": modernbert,
    "bert-dense": bert_dense,
    "bert-dense-max": lambda p: bert_dense(p, "max"),
    "bert-dense-weightedmean": lambda p: bert_dense(p, "weightedmean"),
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
