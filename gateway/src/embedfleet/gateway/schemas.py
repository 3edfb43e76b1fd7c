"""Request and response models: validation of client JSON and the source of /openapi.json.

Requests are parsed with orjson and validated here; responses are built as plain dicts and encoded
with orjson (pydantic-serializing thousands of float vectors would dominate the request's cost), so
the response models exist for the OpenAPI document and for tests.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
)

# The non-empty rules below are enforced by the service (with messages that name the offending
# item), so they appear in the JSON schema only: a pydantic constraint inside a union would turn
# "'input' item 3 is an empty string" into an unreadable union error.
_TEXT: dict[str, Any] = {"type": "string", "minLength": 1}
_IDS: dict[str, Any] = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}


def _list_of(item: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": item, "minItems": 1}


TokenIds = list[StrictInt]
EmbeddingInput = Annotated[
    StrictStr | list[StrictStr] | TokenIds | list[TokenIds],
    WithJsonSchema({"anyOf": [_TEXT, _list_of(_TEXT), _IDS, _list_of(_IDS)]}),
]
Texts = Annotated[StrictStr | list[StrictStr], WithJsonSchema({"anyOf": [_TEXT, _list_of(_TEXT)]})]
InputType = Literal["query", "document"]
TruncationSide = Literal["left", "right"]
EncodingFormat = Literal[
    "float",
    "base64",
    "int8",
    "uint8",
    "binary",
    "ubinary",
    "int8_base64",
    "uint8_base64",
    "binary_base64",
    "ubinary_base64",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    model: StrictStr | None = Field(
        None, description="The served model's name (GET /v1/models); omitted means that model."
    )
    truncate: StrictBool = Field(
        False,
        description="Extension: cut inputs over the model's limit instead of rejecting them.",
    )
    truncation_side: TruncationSide = Field(
        "right", description="Extension: which end `truncate` cuts from."
    )


class EmbeddingRequest(_Request):
    input: EmbeddingInput = Field(
        description="Text, texts, token ids or lists of token ids to embed.",
    )
    encoding_format: EncodingFormat = Field(
        "float",
        description="float: JSON numbers; base64: little-endian float32 bytes, base64-encoded. "
        "Extensions, as sentence-transformers' quantize_embeddings: int8 and uint8 (one byte a "
        "dimension, from the model's calibrated ranges), binary (int8) and ubinary (uint8) "
        "(the sign of 8 dimensions a byte, most significant bit first), as JSON integers; "
        "`<format>_base64` sends the same bytes base64-encoded.",
    )
    dimensions: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="Matryoshka truncation to this many dimensions (then re-normalized)."
    )
    split_long_inputs: StrictBool | None = Field(
        None,
        description="Extension: embed an input over the model's limit as overlapping windows "
        "and return their token-weighted mean (usage counts every window's tokens); omitted "
        "uses the server's default. Not together with `truncate`.",
    )
    user: StrictStr | None = Field(None, description="Accepted for compatibility; not logged.")
    input_type: InputType | None = Field(
        None,
        description="Extension: apply the model's prompt template for queries or documents "
        "(sentence-transformers `prompts`); omitted applies the model's default prompt, if any.",
    )


class Document(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    text: StrictStr = Field(json_schema_extra={"minLength": 1})


class _PairRequest(_Request):
    instruction: StrictStr | None = Field(
        None,
        description="Extension, prompt-template rerankers (Qwen3-Reranker) only: the task "
        "instruction of the judging prompt; omitted uses the model card's default (\"Given a "
        'web search query, retrieve relevant passages that answer the query").',
        json_schema_extra={"minLength": 1},
    )


class RerankRequest(_PairRequest):
    query: StrictStr = Field(
        description="The query every document is scored against.",
        json_schema_extra={"minLength": 1},
    )
    documents: Annotated[
        list[StrictStr | Document],
        WithJsonSchema(_list_of({"anyOf": [_TEXT, {"$ref": "#/components/schemas/Document"}]})),
    ] = Field(description="Documents as strings or {text} objects.")
    top_n: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="Return only the best N results."
    )
    return_documents: StrictBool = Field(
        False, description="Include each document's text in results."
    )


class ScoreRequest(_PairRequest):
    text_1: Texts = Field(description="One text, or a list paired element-wise with text_2.")
    text_2: Texts = Field(
        description="One text, or a list: one text_1 is scored against every text_2."
    )


class ClassifyRequest(_Request):
    input: Texts = Field(description="Text or texts to classify.")
    top_k: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="Keep only each input's best K labels in `labels`; omitted keeps all."
    )
    raw_scores: StrictBool = Field(
        False,
        description="Return the head's raw logits instead of applying its activation (softmax, "
        "or sigmoid for multi-label and one-label heads, from the model's problem_type).",
    )


class SparseEmbeddingRequest(_Request):
    input: EmbeddingInput = Field(
        description="Text, texts, token ids or lists of token ids to embed sparsely.",
    )
    top_k: Annotated[StrictInt, Field(ge=1)] | None = Field(
        None, description="Keep each input's K largest weights; omitted keeps every nonzero one."
    )
    threshold: Annotated[StrictFloat | StrictInt, Field(ge=0)] | None = Field(
        None, description="Drop weights at or below this value; omitted drops only zeros."
    )
    input_type: InputType | None = Field(
        None, description="Extension: apply the model's prompt for queries or documents."
    )


# --- responses (OpenAPI) ---------------------------------------------------------------------


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | list[int] | str = Field(
        description="Numbers for float, integers for int8/uint8/binary/ubinary, a base64 string "
        "for base64 and each `_base64` format."
    )


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: Usage


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: Document | None = None


class RerankResponse(BaseModel):
    model: str
    results: list[RerankResult]
    usage: Usage


class Score(BaseModel):
    object: Literal["score"] = "score"
    index: int
    score: float


class ScoreResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Score]
    model: str
    usage: Usage


class LabelScore(BaseModel):
    label: str
    score: float


class Classification(BaseModel):
    object: Literal["classification"] = "classification"
    index: int
    label: str = Field(description="The best label.")
    score: float = Field(description="The best label's score.")
    labels: list[LabelScore] = Field(description="Labels by descending score (`top_k` of them).")
    probs: list[float] = Field(description="Every label's score in id order (vLLM's field).")
    num_classes: int


class ClassifyResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[Classification]
    model: str
    usage: Usage


class SparseVector(BaseModel):
    indices: list[int] = Field(description="Vocabulary ids, ascending.")
    values: list[float] = Field(description="Their weights, all > 0.")


class SparseEmbedding(BaseModel):
    object: Literal["sparse_embedding"] = "sparse_embedding"
    index: int
    embedding: SparseVector
    dimensions: int = Field(description="The vocabulary size (the dense dimension).")


class SparseEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[SparseEmbedding]
    model: str
    usage: Usage


class Model(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Model]


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorBody
