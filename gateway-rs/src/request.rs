//! The embeddings request, parsed and validated with the Python gateway's rules and words
//! (schemas.py under pydantic strict mode, app.py's messages): the first failing field in the
//! schema's field order is the one reported.

use serde_json::{Map, Value};

use crate::errors::{invalid, ApiError};
use crate::quantization::{self, Encoding};
use crate::tokenization::Side;

#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Texts(Vec<String>),
    Ids(Vec<Vec<i64>>),
}

impl Input {
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
}

const INPUT_EXPECTED: &str = "'input' must be a non-empty string, an array of strings, an array \
    of token ids (integers) or an array of arrays of token ids.";

fn field_error(param: &'static str, msg: &str) -> ApiError {
    invalid(format!("'{param}': {msg}.")).param(param)
}

/// pydantic's literal_error wording: 'a', 'b' or 'c'.
fn literal_message(choices: &[&str]) -> String {
    let quoted: Vec<String> = choices.iter().map(|c| format!("'{c}'")).collect();
    let (last, rest) = quoted.split_last().expect("choices are never empty");
    if rest.is_empty() {
        format!("Input should be {last}")
    } else {
        format!("Input should be {} or {last}", rest.join(", "))
    }
}

fn optional_str(doc: &Map<String, Value>, key: &'static str) -> Result<Option<String>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(field_error(key, "Input should be a valid string")),
    }
}

/// An optional strict integer of at least 1 (pydantic's `StrictInt, Field(ge=1)` or None).
fn optional_positive(doc: &Map<String, Value>, key: &'static str) -> Result<Option<i64>, ApiError> {
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

fn optional_bool(doc: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(field_error(key, "Input should be a valid boolean")),
    }
}

/// A strict boolean defaulting to false (pydantic's `StrictBool = False`: null is refused).
fn flag(doc: &Map<String, Value>, key: &'static str) -> Result<bool, ApiError> {
    match doc.get(key) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(field_error(key, "Input should be a valid boolean")),
    }
}

fn literal<'a>(
    doc: &'a Map<String, Value>,
    key: &'static str,
    choices: &[&str],
    nullable: bool,
) -> Result<Option<&'a str>, ApiError> {
    match doc.get(key) {
        None => Ok(None),
        Some(Value::Null) if nullable => Ok(None),
        Some(Value::String(s)) if choices.contains(&s.as_str()) => Ok(Some(s.as_str())),
        Some(_) => Err(field_error(key, &literal_message(choices))),
    }
}

/// A strict integer: JSON floats (2.0) and booleans are not; integers past i64 keep their sign
/// (they are outside any vocabulary either way).
fn strict_int(v: &Value) -> Option<i64> {
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
fn input(v: &Value) -> Result<Input, ApiError> {
    let bad = || invalid(INPUT_EXPECTED).param("input");
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
fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| {
        // The Python gateway quotes orjson's own words here; the cause is worded differently.
        invalid(format!("The request body is not valid JSON: {e}."))
    })?;
    match doc {
        Value::Object(doc) => Ok(doc),
        _ => Err(invalid("The request body must be a JSON object.")),
    }
}

/// The fields every request has first (schemas.py `_Request`): model, truncate, its side.
fn common(doc: &Map<String, Value>) -> Result<(Option<String>, bool, Side), ApiError> {
    let model = optional_str(doc, "model")?;
    let truncate = flag(doc, "truncate")?;
    let side = match literal(doc, "truncation_side", &["left", "right"], false)? {
        Some("left") => Side::Left,
        _ => Side::Right,
    };
    Ok((model, truncate, side))
}

/// A string or an array of strings (schemas.py `Texts`), else app.py's readable message.
fn texts(doc: &Map<String, Value>, key: &'static str) -> Result<Vec<String>, ApiError> {
    let bad = || invalid(format!("'{key}' must be a string or an array of strings.")).param(key);
    match doc.get(key) {
        None => Err(invalid(format!("'{key}' is required.")).param(key)),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad),
        Some(_) => Err(bad()),
    }
}

/// What the scoring requests share (schemas.py `_PairRequest`).
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

/// POST /v1/rerank, fields in schemas.py's order.
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
    let query = match doc.get("query") {
        None => return Err(invalid("'query' is required.").param("query")),
        Some(Value::String(q)) => q.clone(),
        Some(_) => return Err(invalid("'query' must be a string.").param("query")),
    };
    let bad = || {
        invalid(r#"'documents' must be an array of strings or of {"text": string} objects."#)
            .param("documents")
    };
    let documents = match doc.get("documents") {
        None => return Err(invalid("'documents' is required.").param("documents")),
        Some(Value::Array(items)) => items
            .iter()
            .map(|d| match d {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_string),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?,
        Some(_) => return Err(bad()),
    };
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

/// POST /v1/classify, fields in schemas.py's order.
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
    // A string or strings; any other shape gets app.py's one message for `input`.
    let input = match doc.get("input") {
        None => return Err(invalid("'input' is required.").param("input")),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| invalid(INPUT_EXPECTED).param("input"))?,
        Some(_) => return Err(invalid(INPUT_EXPECTED).param("input")),
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

/// POST /v1/sparse_embeddings, fields in schemas.py's order.
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
        None => return Err(invalid("'input' is required.").param("input")),
        Some(v) => input(v)?,
    };
    let top_k = optional_positive(&doc, "top_k")?;
    // StrictFloat | StrictInt, at least 0: pydantic names the union's first member when the
    // type is wrong.
    let threshold = match doc.get("threshold") {
        None | Some(Value::Null) => 0.0,
        Some(Value::Number(n)) => match n.as_f64() {
            Some(t) if t >= 0.0 => t as f32,
            _ => {
                return Err(field_error(
                    "threshold",
                    "Input should be greater than or equal to 0",
                ))
            }
        },
        Some(_) => {
            return Err(
                invalid("'threshold.float': Input should be a valid number.").param("threshold"),
            )
        }
    };
    let input_type = literal(&doc, "input_type", &["query", "document"], true)?.map(str::to_string);
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

pub fn parse(body: &[u8]) -> Result<EmbeddingRequest, ApiError> {
    let doc = object(body)?;
    let (model, truncate, side) = common(&doc)?;
    let input = match doc.get("input") {
        None => return Err(invalid("'input' is required.").param("input")),
        Some(v) => input(v)?,
    };
    let names = quantization::ENCODINGS.map(|(name, _, _)| name);
    let encoding = literal(&doc, "encoding_format", &names, false)?
        .and_then(quantization::encoding)
        .unwrap_or(quantization::FLOAT);
    let dimensions = optional_positive(&doc, "dimensions")?;
    let split_long_inputs = optional_bool(&doc, "split_long_inputs")?;
    optional_str(&doc, "user")?;
    let input_type = literal(&doc, "input_type", &["query", "document"], true)?.map(str::to_string);
    Ok(EmbeddingRequest {
        model,
        truncate,
        side,
        input,
        encoding,
        dimensions,
        split_long_inputs,
        input_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(body: &str) -> String {
        parse(body.as_bytes()).unwrap_err().message
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
    fn pydantic_wording() {
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
