from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Pooling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    POOLING_DEFAULT: _ClassVar[Pooling]
    POOLING_MEAN: _ClassVar[Pooling]
    POOLING_CLS: _ClassVar[Pooling]
    POOLING_LAST_TOKEN: _ClassVar[Pooling]
    POOLING_MAX: _ClassVar[Pooling]
    POOLING_WEIGHTED_MEAN: _ClassVar[Pooling]
    POOLING_MEAN_SQRT_LEN: _ClassVar[Pooling]

class FloatFormat(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FLOAT_FORMAT_FLOAT32: _ClassVar[FloatFormat]
    FLOAT_FORMAT_FLOAT16: _ClassVar[FloatFormat]
POOLING_DEFAULT: Pooling
POOLING_MEAN: Pooling
POOLING_CLS: Pooling
POOLING_LAST_TOKEN: Pooling
POOLING_MAX: Pooling
POOLING_WEIGHTED_MEAN: Pooling
POOLING_MEAN_SQRT_LEN: Pooling
FLOAT_FORMAT_FLOAT32: FloatFormat
FLOAT_FORMAT_FLOAT16: FloatFormat

class TokenBatch(_message.Message):
    __slots__ = ("token_ids", "lengths", "token_type_ids", "key_lengths")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LENGTHS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TYPE_IDS_FIELD_NUMBER: _ClassVar[int]
    KEY_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    token_ids: bytes
    lengths: bytes
    token_type_ids: bytes
    key_lengths: bytes
    def __init__(self, token_ids: _Optional[bytes] = ..., lengths: _Optional[bytes] = ..., token_type_ids: _Optional[bytes] = ..., key_lengths: _Optional[bytes] = ...) -> None: ...

class EmbedRequest(_message.Message):
    __slots__ = ("batch", "pooling", "normalize", "dimensions", "format")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    POOLING_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    batch: TokenBatch
    pooling: Pooling
    normalize: bool
    dimensions: int
    format: FloatFormat
    def __init__(self, batch: _Optional[_Union[TokenBatch, _Mapping]] = ..., pooling: _Optional[_Union[Pooling, str]] = ..., normalize: _Optional[bool] = ..., dimensions: _Optional[int] = ..., format: _Optional[_Union[FloatFormat, str]] = ...) -> None: ...

class EmbedResponse(_message.Message):
    __slots__ = ("embeddings", "count", "dimensions", "format", "prompt_tokens")
    EMBEDDINGS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    embeddings: bytes
    count: int
    dimensions: int
    format: FloatFormat
    prompt_tokens: int
    def __init__(self, embeddings: _Optional[bytes] = ..., count: _Optional[int] = ..., dimensions: _Optional[int] = ..., format: _Optional[_Union[FloatFormat, str]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("batch", "activate")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    batch: TokenBatch
    activate: bool
    def __init__(self, batch: _Optional[_Union[TokenBatch, _Mapping]] = ..., activate: _Optional[bool] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("scores", "count", "prompt_tokens")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    scores: bytes
    count: int
    prompt_tokens: int
    def __init__(self, scores: _Optional[bytes] = ..., count: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model_name", "task", "dimensions", "max_input_tokens", "vocab_size", "max_batch_tokens", "capacity_tokens_per_second", "dtype", "device", "default_pooling", "default_normalize", "queued_requests", "queued_tokens", "ready", "draining", "instance", "saturated_tokens_per_second")
    MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_INPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_POOLING_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    READY_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    SATURATED_TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    model_name: str
    task: str
    dimensions: int
    max_input_tokens: int
    vocab_size: int
    max_batch_tokens: int
    capacity_tokens_per_second: float
    dtype: str
    device: str
    default_pooling: Pooling
    default_normalize: bool
    queued_requests: int
    queued_tokens: int
    ready: bool
    draining: bool
    instance: str
    saturated_tokens_per_second: float
    def __init__(self, model_name: _Optional[str] = ..., task: _Optional[str] = ..., dimensions: _Optional[int] = ..., max_input_tokens: _Optional[int] = ..., vocab_size: _Optional[int] = ..., max_batch_tokens: _Optional[int] = ..., capacity_tokens_per_second: _Optional[float] = ..., dtype: _Optional[str] = ..., device: _Optional[str] = ..., default_pooling: _Optional[_Union[Pooling, str]] = ..., default_normalize: _Optional[bool] = ..., queued_requests: _Optional[int] = ..., queued_tokens: _Optional[int] = ..., ready: _Optional[bool] = ..., draining: _Optional[bool] = ..., instance: _Optional[str] = ..., saturated_tokens_per_second: _Optional[float] = ...) -> None: ...

class ClassifyRequest(_message.Message):
    __slots__ = ("batch", "activate")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    batch: TokenBatch
    activate: bool
    def __init__(self, batch: _Optional[_Union[TokenBatch, _Mapping]] = ..., activate: _Optional[bool] = ...) -> None: ...

class ClassifyResponse(_message.Message):
    __slots__ = ("scores", "count", "labels", "prompt_tokens")
    SCORES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    scores: bytes
    count: int
    labels: int
    prompt_tokens: int
    def __init__(self, scores: _Optional[bytes] = ..., count: _Optional[int] = ..., labels: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class SparseEmbedRequest(_message.Message):
    __slots__ = ("batch", "top_k", "threshold")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    batch: TokenBatch
    top_k: int
    threshold: float
    def __init__(self, batch: _Optional[_Union[TokenBatch, _Mapping]] = ..., top_k: _Optional[int] = ..., threshold: _Optional[float] = ...) -> None: ...

class SparseEmbedResponse(_message.Message):
    __slots__ = ("offsets", "indices", "values", "count", "dimensions", "prompt_tokens")
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    offsets: bytes
    indices: bytes
    values: bytes
    count: int
    dimensions: int
    prompt_tokens: int
    def __init__(self, offsets: _Optional[bytes] = ..., indices: _Optional[bytes] = ..., values: _Optional[bytes] = ..., count: _Optional[int] = ..., dimensions: _Optional[int] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class MultiVectorEmbedRequest(_message.Message):
    __slots__ = ("batch", "format")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    batch: TokenBatch
    format: FloatFormat
    def __init__(self, batch: _Optional[_Union[TokenBatch, _Mapping]] = ..., format: _Optional[_Union[FloatFormat, str]] = ...) -> None: ...

class MultiVectorEmbedResponse(_message.Message):
    __slots__ = ("vectors", "offsets", "count", "dimensions", "format", "prompt_tokens")
    VECTORS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    vectors: bytes
    offsets: bytes
    count: int
    dimensions: int
    format: FloatFormat
    prompt_tokens: int
    def __init__(self, vectors: _Optional[bytes] = ..., offsets: _Optional[bytes] = ..., count: _Optional[int] = ..., dimensions: _Optional[int] = ..., format: _Optional[_Union[FloatFormat, str]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class HybridEmbedRequest(_message.Message):
    __slots__ = ("batch", "dense", "sparse", "multi_vector", "format", "top_k", "threshold")
    BATCH_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    MULTI_VECTOR_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    batch: TokenBatch
    dense: bool
    sparse: bool
    multi_vector: bool
    format: FloatFormat
    top_k: int
    threshold: float
    def __init__(self, batch: _Optional[_Union[TokenBatch, _Mapping]] = ..., dense: _Optional[bool] = ..., sparse: _Optional[bool] = ..., multi_vector: _Optional[bool] = ..., format: _Optional[_Union[FloatFormat, str]] = ..., top_k: _Optional[int] = ..., threshold: _Optional[float] = ...) -> None: ...

class HybridEmbedResponse(_message.Message):
    __slots__ = ("dense", "sparse", "multi_vector", "prompt_tokens")
    DENSE_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    MULTI_VECTOR_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    dense: EmbedResponse
    sparse: SparseEmbedResponse
    multi_vector: MultiVectorEmbedResponse
    prompt_tokens: int
    def __init__(self, dense: _Optional[_Union[EmbedResponse, _Mapping]] = ..., sparse: _Optional[_Union[SparseEmbedResponse, _Mapping]] = ..., multi_vector: _Optional[_Union[MultiVectorEmbedResponse, _Mapping]] = ..., prompt_tokens: _Optional[int] = ...) -> None: ...

class EmbedCall(_message.Message):
    __slots__ = ("id", "request", "timeout_seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: int
    request: EmbedRequest
    timeout_seconds: float
    def __init__(self, id: _Optional[int] = ..., request: _Optional[_Union[EmbedRequest, _Mapping]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class EmbedReply(_message.Message):
    __slots__ = ("id", "code", "message", "response")
    ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    id: int
    code: int
    message: str
    response: EmbedResponse
    def __init__(self, id: _Optional[int] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., response: _Optional[_Union[EmbedResponse, _Mapping]] = ...) -> None: ...
