//! The requests of each route, parsed and validated strictly (a float is not an integer, nor
//! an integer a boolean): the first failing field, in the order the OpenAPI document lists
//! them, is the one reported.

use serde_json::{Map, Value};

use crate::api::errors::ApiError;

/// Which end of an over-long input `truncate` keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Left,
    Right,
}

/// What an embedding is sent as: float32, int8, uint8, or sign bits packed 8 a byte (binary as
/// int8, ubinary as uint8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Float32,
    Int8,
    Uint8,
    Binary,
    Ubinary,
}

impl Precision {
    pub fn name(self) -> &'static str {
        match self {
            Precision::Float32 => "float32",
            Precision::Int8 => "int8",
            Precision::Uint8 => "uint8",
            Precision::Binary => "binary",
            Precision::Ubinary => "ubinary",
        }
    }

    pub fn needs_ranges(self) -> bool {
        matches!(self, Precision::Int8 | Precision::Uint8)
    }
}

/// An `encoding_format`: the precision and whether the row's bytes go as base64.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoding {
    pub precision: Precision,
    pub base64: bool,
}

/// `encoding_format` -> its encoding, in the document's order.
pub const ENCODINGS: [(&str, Precision, bool); 10] = [
    ("float", Precision::Float32, false),
    ("base64", Precision::Float32, true),
    ("int8", Precision::Int8, false),
    ("uint8", Precision::Uint8, false),
    ("binary", Precision::Binary, false),
    ("ubinary", Precision::Ubinary, false),
    ("int8_base64", Precision::Int8, true),
    ("uint8_base64", Precision::Uint8, true),
    ("binary_base64", Precision::Binary, true),
    ("ubinary_base64", Precision::Ubinary, true),
];

pub const FLOAT: Encoding = Encoding {
    precision: Precision::Float32,
    base64: false,
};

pub fn encoding(name: &str) -> Option<Encoding> {
    ENCODINGS
        .iter()
        .find(|(n, _, _)| *n == name)
        .map(|&(_, precision, base64)| Encoding { precision, base64 })
}

impl Encoding {
    /// Its `encoding_format` name.
    pub fn name(self) -> &'static str {
        ENCODINGS
            .iter()
            .find(|(_, p, b)| *p == self.precision && *b == self.base64)
            .map_or("", |(n, _, _)| n)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Texts(Vec<String>),
    Ids(Vec<Vec<i64>>),
}

impl Input {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        match self {
            Input::Texts(t) => t.len(),
            Input::Ids(s) => s.len(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct EmbeddingRequest {
    pub model: Option<String>,
    pub truncate: bool,
    pub side: Side,
    pub input: Input,
    pub encoding: Encoding,
    pub dimensions: Option<i64>,
    pub split_long_inputs: Option<bool>,
    pub input_type: Option<String>,
    /// None: the model's way (TEI's `normalize` sets it)
    pub normalize: Option<bool>,
}

pub fn field_error(param: &'static str, detail: &'static str) -> ApiError {
    ApiError::Field {
        param,
        at: param,
        detail,
    }
}

pub const SIDES: (&[&str], &str) = (&["left", "right"], "Input should be 'left' or 'right'");
const INPUT_TYPES: (&[&str], &str) = (
    &["query", "document"],
    "Input should be 'query' or 'document'",
);
const ENCODING_CHOICES: &str = "Input should be 'float', 'base64', 'int8', 'uint8', 'binary', \
    'ubinary', 'int8_base64', 'uint8_base64', 'binary_base64' or 'ubinary_base64'";

pub fn optional_str(
    doc: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<String>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(field_error(key, "Input should be a valid string")),
    }
}

/// An optional strict integer of at least 1, or null.
pub fn optional_positive(
    doc: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<i64>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match strict_int(v) {
            Some(n) if n >= 1 => Ok(Some(n)),
            Some(_) => Err(field_error(
                key,
                "Input should be greater than or equal to 1",
            )),
            None => Err(field_error(key, "Input should be a valid integer")),
        },
    }
}

pub fn optional_bool(
    doc: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<bool>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(field_error(key, "Input should be a valid boolean")),
    }
}

/// A strict boolean defaulting to false (null is refused).
pub fn flag(doc: &Map<String, Value>, key: &'static str) -> Result<bool, ApiError> {
    flag_or(doc, key, false)
}

/// A strict boolean defaulting to `default` (null is refused).
pub fn flag_or(
    doc: &Map<String, Value>,
    key: &'static str,
    default: bool,
) -> Result<bool, ApiError> {
    match doc.get(key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(field_error(key, "Input should be a valid boolean")),
    }
}

/// One of `choices.0`, else refused with `choices.1` ("Input should be 'a' or 'b'").
pub fn literal<'a>(
    doc: &'a Map<String, Value>,
    key: &'static str,
    choices: (&[&str], &'static str),
    nullable: bool,
) -> Result<Option<&'a str>, ApiError> {
    match doc.get(key) {
        None => Ok(None),
        Some(Value::Null) if nullable => Ok(None),
        Some(Value::String(s)) if choices.0.contains(&s.as_str()) => Ok(Some(s.as_str())),
        Some(_) => Err(field_error(key, choices.1)),
    }
}

/// A strict integer: JSON floats (2.0) and booleans are not; integers past i64 keep their sign
/// (they are outside any vocabulary either way).
pub fn strict_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) if n.is_i64() => n.as_i64(),
        Value::Number(n) if n.is_u64() => Some(i64::MAX),
        _ => None,
    }
}

fn ids(items: &[Value]) -> Option<Vec<i64>> {
    items.iter().map(strict_int).collect()
}

/// string | list[string] | list[int] | list[list[int]]; a flat id list is one input.
pub fn input(v: &Value) -> Result<Input, ApiError> {
    let bad = || ApiError::InputShape {};
    match v {
        Value::String(s) => Ok(Input::Texts(vec![s.clone()])),
        Value::Array(items) if items.is_empty() => Ok(Input::Texts(Vec::new())),
        Value::Array(items) => match &items[0] {
            Value::String(_) => items
                .iter()
                .map(|i| i.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Input::Texts)
                .ok_or_else(bad),
            Value::Array(_) => items
                .iter()
                .map(|i| i.as_array().and_then(|a| ids(a)))
                .collect::<Option<Vec<_>>>()
                .map(Input::Ids)
                .ok_or_else(bad),
            _ => ids(items).map(|seq| Input::Ids(vec![seq])).ok_or_else(bad),
        },
        _ => Err(bad()),
    }
}

/// The body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| ApiError::BodyNotJson {
        detail: e.to_string(),
    })?;
    match doc {
        Value::Object(doc) => Ok(doc),
        _ => Err(ApiError::BodyNotObject {}),
    }
}

/// The fields every request has first: model, truncate, its side.
pub fn common(doc: &Map<String, Value>) -> Result<(Option<String>, bool, Side), ApiError> {
    let model = optional_str(doc, "model")?;
    let truncate = flag(doc, "truncate")?;
    let side = match literal(doc, "truncation_side", SIDES, false)? {
        Some("left") => Side::Left,
        _ => Side::Right,
    };
    Ok((model, truncate, side))
}

/// A string or an array of strings.
pub fn texts(doc: &Map<String, Value>, key: &'static str) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::TextsShape { param: key };
    match doc.get(key) {
        None => Err(ApiError::Required { param: key }),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// What the scoring requests share.
#[derive(Debug, Clone)]
pub struct PairRequest {
    pub model: Option<String>,
    pub truncate: bool,
    pub side: Side,
    pub instruction: Option<String>,
}

fn pair_request(doc: &Map<String, Value>) -> Result<PairRequest, ApiError> {
    let (model, truncate, side) = common(doc)?;
    let instruction = optional_str(doc, "instruction")?;
    Ok(PairRequest {
        model,
        truncate,
        side,
        instruction,
    })
}

/// `query`: a string.
pub fn query(doc: &Map<String, Value>) -> Result<String, ApiError> {
    match doc.get("query") {
        None => Err(ApiError::Required { param: "query" }),
        Some(Value::String(q)) => Ok(q.clone()),
        Some(_) => Err(ApiError::QueryNotString {}),
    }
}

/// `documents`: strings or {"text": string} objects.
pub fn documents(doc: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    let bad = || ApiError::DocumentsShape {};
    match doc.get("documents") {
        None => Err(ApiError::Required { param: "documents" }),
        Some(Value::Array(items)) => items
            .iter()
            .map(|d| match d {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_string),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// POST /v1/rerank.
#[derive(Debug, Clone)]
pub struct RerankRequest {
    pub pair: PairRequest,
    pub query: String,
    pub documents: Vec<String>,
    pub top_n: Option<i64>,
    pub return_documents: bool,
}

pub fn parse_rerank(body: &[u8]) -> Result<RerankRequest, ApiError> {
    let doc = object(body)?;
    let pair = pair_request(&doc)?;
    let query = query(&doc)?;
    let documents = documents(&doc)?;
    let top_n = optional_positive(&doc, "top_n")?;
    let return_documents = flag(&doc, "return_documents")?;
    Ok(RerankRequest {
        pair,
        query,
        documents,
        top_n,
        return_documents,
    })
}

/// POST /v1/score: one text against many, many against one, or element-wise.
#[derive(Debug, Clone)]
pub struct ScoreRequest {
    pub pair: PairRequest,
    /// (text_1 was one string, its texts)
    pub text_1: (bool, Vec<String>),
    pub text_2: (bool, Vec<String>),
}

pub fn parse_score(body: &[u8]) -> Result<ScoreRequest, ApiError> {
    let doc = object(body)?;
    let pair = pair_request(&doc)?;
    let one = |key| matches!(doc.get(key), Some(Value::String(_)));
    let text_1 = (one("text_1"), texts(&doc, "text_1")?);
    let text_2 = (one("text_2"), texts(&doc, "text_2")?);
    Ok(ScoreRequest {
        pair,
        text_1,
        text_2,
    })
}

/// POST /v1/classify.
#[derive(Debug, Clone)]
pub struct ClassifyRequest {
    pub model: Option<String>,
    pub truncate: bool,
    pub side: Side,
    pub input: Vec<String>,
    pub top_k: Option<i64>,
    pub raw_scores: bool,
}

pub fn parse_classify(body: &[u8]) -> Result<ClassifyRequest, ApiError> {
    let doc = object(body)?;
    let (model, truncate, side) = common(&doc)?;
    // A string or strings; any other shape gets the one message for `input`.
    let input = match doc.get("input") {
        None => return Err(ApiError::Required { param: "input" }),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or(ApiError::InputShape {})?,
        Some(_) => return Err(ApiError::InputShape {}),
    };
    let top_k = optional_positive(&doc, "top_k")?;
    let raw_scores = flag(&doc, "raw_scores")?;
    Ok(ClassifyRequest {
        model,
        truncate,
        side,
        input,
        top_k,
        raw_scores,
    })
}

/// POST /v1/sparse_embeddings.
#[derive(Debug, Clone)]
pub struct SparseRequest {
    pub model: Option<String>,
    pub truncate: bool,
    pub side: Side,
    pub input: Input,
    pub top_k: Option<i64>,
    /// weights at or below it are dropped (0: only zeros)
    pub threshold: f32,
    pub input_type: Option<String>,
}

pub fn parse_sparse(body: &[u8]) -> Result<SparseRequest, ApiError> {
    let doc = object(body)?;
    let (model, truncate, side) = common(&doc)?;
    let input = match doc.get("input") {
        None => return Err(ApiError::Required { param: "input" }),
        Some(v) => input(v)?,
    };
    let top_k = optional_positive(&doc, "top_k")?;
    let threshold = threshold(&doc)?;
    let input_type = literal(&doc, "input_type", INPUT_TYPES, true)?.map(str::to_string);
    Ok(SparseRequest {
        model,
        truncate,
        side,
        input,
        top_k,
        threshold,
        input_type,
    })
}

/// `threshold`: a number (float or integer), at least 0, 0 when absent; the wrong type names
/// the float member.
fn threshold(doc: &Map<String, Value>) -> Result<f32, ApiError> {
    match doc.get("threshold") {
        None | Some(Value::Null) => Ok(0.0),
        Some(Value::Number(n)) => match n.as_f64() {
            Some(t) if t >= 0.0 => Ok(t as f32),
            _ => Err(field_error(
                "threshold",
                "Input should be greater than or equal to 0",
            )),
        },
        Some(_) => Err(ApiError::Field {
            param: "threshold",
            at: "threshold.float",
            detail: "Input should be a valid number",
        }),
    }
}

/// POST /v1/multi-vector: a vector per token of each input.
#[derive(Debug, Clone)]
pub struct MultiVectorRequest {
    pub model: Option<String>,
    pub truncate: bool,
    pub side: Side,
    pub input: Input,
    /// each input's vectors as base64 of its row-major little-endian float32s
    pub base64: bool,
    pub input_type: Option<String>,
}

const MULTI_VECTOR_ENCODINGS: (&[&str], &str) =
    (&["float", "base64"], "Input should be 'float' or 'base64'");

pub fn parse_multi_vector(body: &[u8]) -> Result<MultiVectorRequest, ApiError> {
    let doc = object(body)?;
    let (model, truncate, side) = common(&doc)?;
    let input = match doc.get("input") {
        None => return Err(ApiError::Required { param: "input" }),
        Some(v) => input(v)?,
    };
    let base64 = literal(&doc, "encoding_format", MULTI_VECTOR_ENCODINGS, false)? == Some("base64");
    optional_str(&doc, "user")?;
    let input_type = literal(&doc, "input_type", INPUT_TYPES, true)?.map(str::to_string);
    Ok(MultiVectorRequest {
        model,
        truncate,
        side,
        input,
        base64,
        input_type,
    })
}

/// Which of a hybrid model's outputs a request wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outputs {
    pub dense: bool,
    pub sparse: bool,
    pub multi_vector: bool,
}

const OUTPUT_NAMES: &str =
    "Input should be a non-empty list of 'dense', 'sparse' or 'multi_vector'";

/// POST /v1/hybrid-embeddings: a hybrid model's (bge-m3's) dense vector, lexical weights and
/// token vectors of each input, from one forward.
#[derive(Debug, Clone)]
pub struct HybridRequest {
    pub model: Option<String>,
    pub truncate: bool,
    pub side: Side,
    pub input: Input,
    pub outputs: Outputs,
    /// the dense and token vectors as base64 of their row-major little-endian float32s
    pub base64: bool,
    pub top_k: Option<i64>,
    pub threshold: f32,
    pub input_type: Option<String>,
}

pub fn parse_hybrid(body: &[u8]) -> Result<HybridRequest, ApiError> {
    let doc = object(body)?;
    let (model, truncate, side) = common(&doc)?;
    let input = match doc.get("input") {
        None => return Err(ApiError::Required { param: "input" }),
        Some(v) => input(v)?,
    };
    let outputs = match doc.get("outputs") {
        None | Some(Value::Null) => Outputs {
            dense: true,
            sparse: true,
            multi_vector: true,
        },
        Some(Value::Array(names)) if !names.is_empty() => {
            let mut wanted = Outputs {
                dense: false,
                sparse: false,
                multi_vector: false,
            };
            for name in names {
                match name.as_str() {
                    Some("dense") => wanted.dense = true,
                    Some("sparse") => wanted.sparse = true,
                    Some("multi_vector") => wanted.multi_vector = true,
                    _ => return Err(field_error("outputs", OUTPUT_NAMES)),
                }
            }
            wanted
        }
        Some(_) => return Err(field_error("outputs", OUTPUT_NAMES)),
    };
    let base64 = literal(&doc, "encoding_format", MULTI_VECTOR_ENCODINGS, false)? == Some("base64");
    let top_k = optional_positive(&doc, "top_k")?;
    let threshold = threshold(&doc)?;
    optional_str(&doc, "user")?;
    let input_type = literal(&doc, "input_type", INPUT_TYPES, true)?.map(str::to_string);
    Ok(HybridRequest {
        model,
        truncate,
        side,
        input,
        outputs,
        base64,
        top_k,
        threshold,
        input_type,
    })
}

/// A parsed request for the workers, whichever API's route it came by.
#[derive(Debug, Clone)]
pub enum Call {
    Embeddings(EmbeddingRequest),
    Rerank(RerankRequest),
    Score(ScoreRequest),
    Classify(ClassifyRequest),
    Sparse(SparseRequest),
    MultiVector(MultiVectorRequest),
    Hybrid(HybridRequest),
}

impl Call {
    /// The body's `model`, which names the served model to answer it.
    pub fn model(&self) -> Option<&str> {
        match self {
            Call::Embeddings(r) => r.model.as_deref(),
            Call::Rerank(r) => r.pair.model.as_deref(),
            Call::Score(r) => r.pair.model.as_deref(),
            Call::Classify(r) => r.model.as_deref(),
            Call::Sparse(r) => r.model.as_deref(),
            Call::MultiVector(r) => r.model.as_deref(),
            Call::Hybrid(r) => r.model.as_deref(),
        }
    }
}

/// The OpenAI-style request of `route`, one of the /v1/ POST routes.
pub fn parse_call(route: &str, body: &[u8]) -> Result<Call, ApiError> {
    Ok(match route {
        "/v1/rerank" => Call::Rerank(parse_rerank(body)?),
        "/v1/score" => Call::Score(parse_score(body)?),
        "/v1/classify" => Call::Classify(parse_classify(body)?),
        "/v1/sparse_embeddings" => Call::Sparse(parse_sparse(body)?),
        "/v1/multi-vector" => Call::MultiVector(parse_multi_vector(body)?),
        "/v1/hybrid-embeddings" => Call::Hybrid(parse_hybrid(body)?),
        _ => Call::Embeddings(parse(body)?),
    })
}

pub fn parse(body: &[u8]) -> Result<EmbeddingRequest, ApiError> {
    let doc = object(body)?;
    let (model, truncate, side) = common(&doc)?;
    let input = match doc.get("input") {
        None => return Err(ApiError::Required { param: "input" }),
        Some(v) => input(v)?,
    };
    let names = ENCODINGS.map(|(name, _, _)| name);
    let encoding = literal(&doc, "encoding_format", (&names, ENCODING_CHOICES), false)?
        .and_then(encoding)
        .unwrap_or(FLOAT);
    let dimensions = optional_positive(&doc, "dimensions")?;
    let split_long_inputs = optional_bool(&doc, "split_long_inputs")?;
    optional_str(&doc, "user")?;
    let input_type = literal(&doc, "input_type", INPUT_TYPES, true)?.map(str::to_string);
    Ok(EmbeddingRequest {
        model,
        truncate,
        side,
        input,
        encoding,
        dimensions,
        split_long_inputs,
        input_type,
        normalize: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        parse(body.as_bytes()).unwrap_err().message()
    }

    const INPUT_EXPECTED: &str = "'input' must be a non-empty string, an array of strings, an \
        array of token ids (integers) or an array of arrays of token ids.";

    #[test]
    fn the_encoding_choices_name_every_encoding() {
        let quoted: Vec<String> = ENCODINGS.iter().map(|(n, _, _)| format!("'{n}'")).collect();
        let (last, rest) = quoted.split_last().unwrap();
        let want = format!("Input should be {} or {last}", rest.join(", "));
        assert_eq!(ENCODING_CHOICES, want);
    }

    #[test]
    fn input_forms() {
        let p = |b: &str| parse(b.as_bytes()).unwrap().input;
        assert_eq!(p(r#"{"input":"a"}"#), Input::Texts(vec!["a".into()]));
        assert_eq!(p(r#"{"input":[1,2]}"#), Input::Ids(vec![vec![1, 2]]));
        assert_eq!(
            p(r#"{"input":[[1],[2,3]]}"#),
            Input::Ids(vec![vec![1], vec![2, 3]])
        );
        assert_eq!(p(r#"{"input":[]}"#), Input::Texts(vec![]));
        assert_eq!(err(r#"{"input":["a",1]}"#), INPUT_EXPECTED);
        assert_eq!(err(r#"{"input":[1.0]}"#), INPUT_EXPECTED);
        assert_eq!(err(r#"{"input":[true]}"#), INPUT_EXPECTED);
    }

    #[test]
    fn multi_vector_requests() {
        let p = |b: &str| parse_multi_vector(b.as_bytes());
        let r = p(r#"{"model":"m","input":["a","b"],"encoding_format":"base64"}"#).unwrap();
        assert_eq!(r.input, Input::Texts(vec!["a".into(), "b".into()]));
        assert!(r.base64 && r.model.as_deref() == Some("m"));
        assert!(!p(r#"{"input":[[1,2]]}"#).unwrap().base64);
        let msg = |b: &str| p(b).unwrap_err().message();
        assert_eq!(
            msg(r#"{"input":"a","encoding_format":"int8"}"#),
            "'encoding_format': Input should be 'float' or 'base64'."
        );
        assert_eq!(msg(r#"{"input":{}}"#), INPUT_EXPECTED);
        assert_eq!(msg(r#"{"model":"m"}"#), "'input' is required.");
        assert!(matches!(
            parse_call("/v1/multi-vector", br#"{"input":"a"}"#),
            Ok(Call::MultiVector(_))
        ));
    }

    #[test]
    fn field_errors_name_the_first_failing_field() {
        assert_eq!(err("{}"), "'input' is required.");
        assert_eq!(
            err(r#"{"input":"a","truncation_side":"x"}"#),
            "'truncation_side': Input should be 'left' or 'right'."
        );
        assert_eq!(
            err(r#"{"input":"a","dimensions":0}"#),
            "'dimensions': Input should be greater than or equal to 1."
        );
        // the first failing field in schema order wins: model before input
        assert_eq!(
            err(r#"{"input":1,"model":2}"#),
            "'model': Input should be a valid string."
        );
        assert_eq!(err("[1]"), "The request body must be a JSON object.");
    }
}
