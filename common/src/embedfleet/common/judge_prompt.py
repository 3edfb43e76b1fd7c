"""Qwen3-Reranker's official prompt: the chat frame a (query, document) pair is judged in.

The model reads the instruction, query and document inside a system/user/assistant frame that
ends in an empty <think> block, and its relevance is P("yes") against "no" as the next token.
The gateway renders the frame (tokenization); the worker reads the two answer tokens' logits.
Text and default instruction as the model card (Qwen/Qwen3-Reranker-0.6B) gives them.
"""

from __future__ import annotations

SYSTEM = (
    "Judge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".'
)
PREFIX = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
#: the answer tokens, as the tokenizer's vocabulary spells them
YES = "yes"
NO = "no"


def body(instruction: str, query: str, document: str) -> str:
    """The user turn between PREFIX and SUFFIX, tokenized without special tokens."""
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
