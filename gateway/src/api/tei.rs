//! text-embeddings-inference's API (TEI): each of its requests read into the gateway's own
//! request (the one its OpenAI-style route parses), plus what shapes TEI's answer. Fields are
//! read as strictly as the OpenAI routes', the first failing one reported.

use serde_json::{Map, Value};

use crate::api::errors::ApiError;
use crate::api::request::{
    field_error, flag, flag_or, input, object, optional_bool, optional_positive, optional_str,
    query, strict_int, texts, Call, ClassifyRequest, EmbeddingRequest, Input, MultiVectorRequest,
    PairRequest, RerankRequest, ScoreRequest, Side, SparseRequest, FLOAT,
};

/// How TEI writes the answer of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// rows of floats
    Embed,
    /// rows of {index, value}
    Sparse,
    /// a row of floats per token of each input
    EmbedAll,
    /// ranks best first; `raw`: scores before the reranker's sigmoid
    Rerank { raw: bool },
    /// label scores best first; `single`: one input, not a batch
    Predict { single: bool },
    /// one cosine a sentence
    Similarity,
}

/// POST /tokenize.
#[derive(Debug, Clone)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub inputs: Vec<String>,
    pub add_special_tokens: bool,
    pub prompt_name: Option<String>,
}

/// POST /decode.
#[derive(Debug, Clone)]
pub struct DecodeRequest {
    pub model: Option<String>,
    pub ids: Vec<Vec<i64>>,
    pub skip_special_tokens: bool,
}

/// A TEI request: work for the workers, or the tokenizer's alone.
#[derive(Debug, Clone)]
pub enum Tei {
    Call(Call, Shape),
    Tokenize(TokenizeRequest),
    Decode(DecodeRequest),
}

const DIRECTIONS: &[&str] = &["Left", "Right", "left", "right"];

/// `truncate` (a boolean or null) and `truncation_direction` (TEI's Left or Right).
fn truncation(doc: &Map<String, Value>) -> Result<(bool, Side), ApiError> {
    let truncate = optional_bool(doc, "truncate")?.unwrap_or(false);
    let side = match doc.get("truncation_direction") {
        None => Side::Right,
        Some(Value::String(s)) if DIRECTIONS.contains(&s.as_str()) => {
            if s.eq_ignore_ascii_case("left") {
                Side::Left
            } else {
                Side::Right
            }
        }
        Some(_) => {
            return Err(field_error(
                "truncation_direction",
                "Input should be 'Left' or 'Right'",
            ))
        }
    };
    Ok((truncate, side))
}

/// `inputs`: a string, strings, token ids or lists of token ids.
fn inputs(doc: &Map<String, Value>) -> Result<Input, ApiError> {
    match doc.get("inputs") {
        None => Err(ApiError::Required { param: "inputs" }),
        Some(v) => input(v),
    }
}

fn embed(doc: &Map<String, Value>) -> Result<Call, ApiError> {
    let model = optional_str(doc, "model")?;
    let input = inputs(doc)?;
    let normalize = flag_or(doc, "normalize", true)?;
    let (truncate, side) = truncation(doc)?;
    let input_type = optional_str(doc, "prompt_name")?;
    let dimensions = optional_positive(doc, "dimensions")?;
    Ok(Call::Embeddings(EmbeddingRequest {
        model,
        truncate,
        side,
        input,
        encoding: FLOAT,
        dimensions,
        split_long_inputs: None,
        input_type,
        normalize: Some(normalize),
    }))
}

fn sparse(doc: &Map<String, Value>) -> Result<Call, ApiError> {
    let model = optional_str(doc, "model")?;
    let input = inputs(doc)?;
    let (truncate, side) = truncation(doc)?;
    let input_type = optional_str(doc, "prompt_name")?;
    Ok(Call::Sparse(SparseRequest {
        model,
        truncate,
        side,
        input,
        top_k: None,
        threshold: 0.0,
        input_type,
    }))
}

fn embed_all(doc: &Map<String, Value>) -> Result<Call, ApiError> {
    let model = optional_str(doc, "model")?;
    let input = inputs(doc)?;
    let (truncate, side) = truncation(doc)?;
    let input_type = optional_str(doc, "prompt_name")?;
    Ok(Call::MultiVector(MultiVectorRequest {
        model,
        truncate,
        side,
        input,
        base64: false,
        input_type,
    }))
}

fn pair(doc: &Map<String, Value>) -> Result<PairRequest, ApiError> {
    let model = optional_str(doc, "model")?;
    let (truncate, side) = truncation(doc)?;
    Ok(PairRequest {
        model,
        truncate,
        side,
        instruction: None,
    })
}

fn rerank(doc: &Map<String, Value>) -> Result<(Call, Shape), ApiError> {
    let pair = pair(doc)?;
    let query = query(doc)?;
    let documents = match doc.get("texts") {
        Some(Value::String(_)) => return Err(ApiError::TextsShape { param: "texts" }),
        _ => texts(doc, "texts")?,
    };
    let raw = flag(doc, "raw_scores")?;
    let return_documents = flag(doc, "return_text")?;
    let req = RerankRequest {
        pair,
        query,
        documents,
        top_n: None,
        return_documents,
    };
    Ok((Call::Rerank(req), Shape::Rerank { raw }))
}

/// TEI's predict inputs: a string, or a batch of one-string lists. A pair ([a, b], or [[a, b]]
/// in a batch) is a cross-encoder's input, which /rerank serves.
fn predict_inputs(v: Option<&Value>) -> Result<(Vec<String>, bool), ApiError> {
    let pairs = || {
        field_error(
            "inputs",
            "Input should be a string or a batch of one-string lists; pairs are served by /rerank",
        )
    };
    match v {
        None => Err(ApiError::Required { param: "inputs" }),
        Some(Value::String(s)) => Ok((vec![s.clone()], true)),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            Ok((vec![items[0].as_str().unwrap_or("").to_string()], true))
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| match i.as_array().map(Vec::as_slice) {
                Some([Value::String(s)]) => Some(s.clone()),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|texts| (texts, false))
            .ok_or_else(pairs),
        Some(_) => Err(pairs()),
    }
}

fn predict(doc: &Map<String, Value>) -> Result<(Call, Shape), ApiError> {
    let model = optional_str(doc, "model")?;
    let (input, single) = predict_inputs(doc.get("inputs"))?;
    let (truncate, side) = truncation(doc)?;
    let raw_scores = flag(doc, "raw_scores")?;
    let req = ClassifyRequest {
        model,
        truncate,
        side,
        input,
        top_k: None,
        raw_scores,
    };
    Ok((Call::Classify(req), Shape::Predict { single }))
}

fn similarity(doc: &Map<String, Value>) -> Result<Call, ApiError> {
    let pair = pair(doc)?;
    let Some(Value::Object(inputs)) = doc.get("inputs") else {
        return Err(match doc.get("inputs") {
            None => ApiError::Required { param: "inputs" },
            Some(_) => field_error("inputs", "Input should be a valid object"),
        });
    };
    let source = match inputs.get("source_sentence") {
        Some(Value::String(s)) => s.clone(),
        None => {
            return Err(ApiError::Required {
                param: "source_sentence",
            })
        }
        Some(_) => {
            return Err(field_error(
                "source_sentence",
                "Input should be a valid string",
            ))
        }
    };
    let sentences = match inputs.get("sentences") {
        Some(Value::String(_)) => return Err(ApiError::TextsShape { param: "sentences" }),
        _ => texts(inputs, "sentences")?,
    };
    Ok(Call::Score(ScoreRequest {
        pair,
        text_1: (true, vec![source]),
        text_2: (false, sentences),
    }))
}

fn tokenize(doc: &Map<String, Value>) -> Result<TokenizeRequest, ApiError> {
    let model = optional_str(doc, "model")?;
    let inputs = texts(doc, "inputs")?;
    let add_special_tokens = flag_or(doc, "add_special_tokens", true)?;
    let prompt_name = optional_str(doc, "prompt_name")?;
    Ok(TokenizeRequest {
        model,
        inputs,
        add_special_tokens,
        prompt_name,
    })
}

fn decode(doc: &Map<String, Value>) -> Result<DecodeRequest, ApiError> {
    let model = optional_str(doc, "model")?;
    let bad = || {
        field_error(
            "ids",
            "Input should be a list of token ids or of such lists",
        )
    };
    let ids = match doc.get("ids") {
        None => return Err(ApiError::Required { param: "ids" }),
        Some(Value::Array(items)) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|i| {
                i.as_array()
                    .and_then(|a| a.iter().map(strict_int).collect())
            })
            .collect::<Option<Vec<Vec<i64>>>>()
            .ok_or_else(bad)?,
        Some(Value::Array(items)) => vec![items
            .iter()
            .map(strict_int)
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(bad)?],
        Some(_) => return Err(bad()),
    };
    let skip_special_tokens = flag_or(doc, "skip_special_tokens", true)?;
    Ok(DecodeRequest {
        model,
        ids,
        skip_special_tokens,
    })
}

/// The request of TEI route `route` (POST / is read as the route the model's task takes).
pub fn parse(route: &str, body: &[u8]) -> Result<Tei, ApiError> {
    let doc = object(body)?;
    Ok(match route {
        "/embed" => Tei::Call(embed(&doc)?, Shape::Embed),
        "/embed_sparse" => Tei::Call(sparse(&doc)?, Shape::Sparse),
        "/embed_all" => Tei::Call(embed_all(&doc)?, Shape::EmbedAll),
        "/rerank" => {
            let (call, shape) = rerank(&doc)?;
            Tei::Call(call, shape)
        }
        "/predict" => {
            let (call, shape) = predict(&doc)?;
            Tei::Call(call, shape)
        }
        "/similarity" => Tei::Call(similarity(&doc)?, Shape::Similarity),
        "/tokenize" => Tei::Tokenize(tokenize(&doc)?),
        _ => Tei::Decode(decode(&doc)?),
    })
}

/// The `model` a TEI body names (an extension: TEI serves one model), read before its route
/// is known (POST /).
pub fn model_of(body: &[u8]) -> Result<Option<String>, ApiError> {
    optional_str(&object(body)?, "model")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(route: &str, body: &str) -> (Call, Shape) {
        match parse(route, body.as_bytes()).unwrap() {
            Tei::Call(c, s) => (c, s),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn embed_reads_tei_fields() {
        let body = r#"{"inputs":["a","b"],"normalize":false,"truncate":true,
            "truncation_direction":"Left","prompt_name":"query","dimensions":8}"#;
        let (Call::Embeddings(r), Shape::Embed) = call("/embed", body) else {
            panic!()
        };
        assert_eq!(r.input, Input::Texts(vec!["a".into(), "b".into()]));
        assert_eq!(
            (r.normalize, r.truncate, r.side),
            (Some(false), true, Side::Left)
        );
        assert_eq!(
            (r.input_type.as_deref(), r.dimensions),
            (Some("query"), Some(8))
        );
    }

    #[test]
    fn predict_tells_a_single_input_from_a_batch_and_refuses_pairs() {
        let (Call::Classify(r), shape) = call("/predict", r#"{"inputs":"a"}"#) else {
            panic!()
        };
        assert_eq!(
            (r.input, shape),
            (vec!["a".into()], Shape::Predict { single: true })
        );
        let (Call::Classify(r), shape) = call("/predict", r#"{"inputs":[["a"],["b"]]}"#) else {
            panic!()
        };
        assert_eq!(r.input.len(), 2);
        assert_eq!(shape, Shape::Predict { single: false });
        let err = parse("/predict", br#"{"inputs":["a","b"]}"#).unwrap_err();
        assert!(err.message().contains("/rerank"), "{}", err.message());
    }

    #[test]
    fn rerank_similarity_and_decode() {
        let (Call::Rerank(r), shape) = call(
            "/rerank",
            r#"{"query":"q","texts":["a"],"return_text":true,"raw_scores":true}"#,
        ) else {
            panic!()
        };
        assert!(r.return_documents);
        assert_eq!(shape, Shape::Rerank { raw: true });
        let body = r#"{"inputs":{"source_sentence":"s","sentences":["a","b"]}}"#;
        let (Call::Score(r), _) = call("/similarity", body) else {
            panic!()
        };
        assert_eq!((r.text_1.1.len(), r.text_2.1.len()), (1, 2));
        let Tei::Decode(d) = parse("/decode", br#"{"ids":[1,2]}"#).unwrap() else {
            panic!()
        };
        assert_eq!((d.ids, d.skip_special_tokens), (vec![vec![1, 2]], true));
        let err = parse("/embed", br#"{"inputs":"a","truncation_direction":"up"}"#);
        assert_eq!(err.unwrap_err().param(), Some("truncation_direction"));
    }
}
