//! Cohere's v2 API: POST /v2/embed and /v2/rerank read into the gateway's own requests, plus
//! what shapes Cohere's answer. Cohere's fields only: images, `inputs` and token caps are
//! refused rather than ignored.

use serde_json::{Map, Value};

use crate::api::errors::ApiError;
use crate::api::request::{
    documents, encoding, field_error, flag, object, optional_positive, optional_str, query, Call,
    EmbeddingRequest, Encoding, Input, PairRequest, RerankRequest, Side,
};

/// How Cohere writes the answer of a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// every embedding type asked for, each `(its name, its encoding)`
    Embed {
        types: Vec<(&'static str, Encoding)>,
    },
    Rerank,
}

/// Cohere's embedding types, each as its `encoding_format`.
const TYPES: [(&str, &str); 6] = [
    ("float", "float"),
    ("int8", "int8"),
    ("uint8", "uint8"),
    ("binary", "binary"),
    ("ubinary", "ubinary"),
    ("base64", "base64"),
];
const TYPE_CHOICES: &str =
    "Input should be a list of 'float', 'int8', 'uint8', 'binary', 'ubinary' or 'base64'";
const INPUT_TYPES: [(&str, Option<&str>); 4] = [
    ("search_query", Some("query")),
    ("search_document", Some("document")),
    ("classification", None),
    ("clustering", None),
];

/// `embedding_types`: a non-empty list of distinct types; float when absent.
fn types(doc: &Map<String, Value>) -> Result<Vec<(&'static str, Encoding)>, ApiError> {
    let bad = || field_error("embedding_types", TYPE_CHOICES);
    let float = encoding("float").ok_or_else(bad)?;
    let items = match doc.get("embedding_types") {
        None | Some(Value::Null) => return Ok(vec![("float", float)]),
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(_) => return Err(bad()),
    };
    let mut out: Vec<(&'static str, Encoding)> = Vec::new();
    for item in items {
        let found = TYPES.iter().find(|(name, _)| Some(*name) == item.as_str());
        let (name, format) = found.ok_or_else(bad)?;
        if !out.iter().any(|(n, _)| n == name) {
            out.push((name, encoding(format).ok_or_else(bad)?));
        }
    }
    Ok(out)
}

/// Cohere's `truncate`: NONE refuses over-long inputs, START cuts their start, END (the
/// default) their end.
fn truncate(doc: &Map<String, Value>) -> Result<(bool, Side), ApiError> {
    match doc.get("truncate") {
        None | Some(Value::Null) => Ok((true, Side::Right)),
        Some(Value::String(s)) if s == "END" => Ok((true, Side::Right)),
        Some(Value::String(s)) if s == "START" => Ok((true, Side::Left)),
        Some(Value::String(s)) if s == "NONE" => Ok((false, Side::Right)),
        Some(_) => Err(field_error(
            "truncate",
            "Input should be 'NONE', 'START' or 'END'",
        )),
    }
}

/// A field this gateway does not take, refused when set (null is as absent).
fn refused(
    doc: &Map<String, Value>,
    key: &'static str,
    detail: &'static str,
) -> Result<(), ApiError> {
    match doc.get(key) {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(field_error(key, detail)),
    }
}

fn embed(doc: &Map<String, Value>) -> Result<(Call, Shape), ApiError> {
    let model = optional_str(doc, "model")?;
    let bad = || ApiError::TextsShape { param: "texts" };
    let texts = match doc.get("texts") {
        None => return Err(ApiError::Required { param: "texts" }),
        Some(Value::Array(items)) => items
            .iter()
            .map(|i| i.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?,
        Some(_) => return Err(bad()),
    };
    refused(
        doc,
        "images",
        "images are not served: this gateway embeds text",
    )?;
    refused(doc, "inputs", "'inputs' is not served: pass 'texts'")?;
    refused(
        doc,
        "max_tokens",
        "'max_tokens' is not served: use 'truncate'",
    )?;
    let input_type = match doc.get("input_type") {
        None | Some(Value::Null) => None,
        Some(v) => INPUT_TYPES
            .iter()
            .find(|(name, _)| Some(*name) == v.as_str())
            .ok_or_else(|| {
                field_error(
                    "input_type",
                    "Input should be 'search_query', 'search_document', 'classification' or \
                     'clustering'",
                )
            })?
            .1
            .map(str::to_string),
    };
    let types = types(doc)?;
    let dimensions = optional_positive(doc, "output_dimension")?;
    let (truncate, side) = truncate(doc)?;
    let req = EmbeddingRequest {
        model,
        truncate,
        side,
        input: Input::Texts(texts),
        encoding: types[0].1,
        dimensions,
        split_long_inputs: Some(false),
        input_type,
        normalize: None,
    };
    Ok((Call::Embeddings(req), Shape::Embed { types }))
}

fn rerank(doc: &Map<String, Value>) -> Result<(Call, Shape), ApiError> {
    let model = optional_str(doc, "model")?;
    let query = query(doc)?;
    let documents = documents(doc)?;
    let top_n = optional_positive(doc, "top_n")?;
    refused(
        doc,
        "max_tokens_per_doc",
        "'max_tokens_per_doc' is not served: documents are cut at the model's limit",
    )?;
    let return_documents = flag(doc, "return_documents")?;
    let pair = PairRequest {
        model,
        // Cohere cuts long documents rather than refusing them.
        truncate: true,
        side: Side::Right,
        instruction: None,
    };
    let req = RerankRequest {
        pair,
        query,
        documents,
        top_n,
        return_documents,
    };
    Ok((Call::Rerank(req), Shape::Rerank))
}

/// The request of Cohere route `route` (/v2/embed or /v2/rerank).
pub fn parse(route: &str, body: &[u8]) -> Result<(Call, Shape), ApiError> {
    let doc = object(body)?;
    match route {
        "/v2/rerank" => rerank(&doc),
        _ => embed(&doc),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embed_reads_cohere_fields() {
        let body = br#"{"model":"m","texts":["a"],"input_type":"search_query",
            "embedding_types":["int8","float","int8"],"output_dimension":64,"truncate":"START"}"#;
        let (Call::Embeddings(r), Shape::Embed { types }) = parse("/v2/embed", body).unwrap()
        else {
            panic!()
        };
        let names: Vec<_> = types.iter().map(|t| t.0).collect();
        assert_eq!(names, ["int8", "float"]);
        assert_eq!(
            (r.input_type.as_deref(), r.dimensions),
            (Some("query"), Some(64))
        );
        assert_eq!((r.truncate, r.side), (true, Side::Left));
        let err = parse("/v2/embed", br#"{"texts":["a"],"embedding_types":["f16"]}"#);
        assert_eq!(err.unwrap_err().param(), Some("embedding_types"));
        let err = parse("/v2/embed", br#"{"texts":["a"],"images":["x"]}"#);
        assert_eq!(err.unwrap_err().param(), Some("images"));
    }

    #[test]
    fn rerank_cuts_long_documents_and_keeps_top_n() {
        let body = br#"{"query":"q","documents":["a","b"],"top_n":1}"#;
        let (Call::Rerank(r), Shape::Rerank) = parse("/v2/rerank", body).unwrap() else {
            panic!()
        };
        assert_eq!((r.top_n, r.pair.truncate), (Some(1), true));
    }
}
