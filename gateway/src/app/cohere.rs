//! Cohere's v2 answers: each call through the same service endpoints the OpenAI-style routes
//! use, written in Cohere's shapes (embeddings by type, results with relevance scores).

use base64::Engine;
use serde_json::{json, Map, Value};

use crate::api::cohere::Shape;
use crate::api::errors::ApiError;
use crate::api::request::{Call, EmbeddingRequest, Encoding, Input, Precision};
use crate::app::service::{Embedded, Service};
use crate::model::quantization::{quantize, Row};
use crate::plan::admission::Ticket;

fn bytes(doc: &Value) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(doc).map_err(|_| ApiError::Internal {})
}

fn meta(units: Value) -> Value {
    json!({"api_version": {"version": "2"}, "billed_units": units})
}

fn id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

/// The rows in one embedding type: float rows, integers, or base64 of the float32 bytes.
fn rows_as(
    service: &Service,
    e: &Embedded<'_>,
    encoding: Encoding,
) -> Result<Vec<Value>, ApiError> {
    let ranges = service.ranges(encoding, e.dims)?;
    let rows = e.rows.chunks(e.dims.max(1));
    Ok(match (encoding.precision, encoding.base64) {
        (Precision::Float32, false) => rows.map(|r| json!(r)).collect(),
        (Precision::Float32, true) => rows
            .map(|r| {
                let raw: Vec<u8> = r.iter().flat_map(|v| v.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(raw))
            })
            .collect(),
        (precision, _) => rows
            .map(|r| match quantize(r, precision, ranges) {
                Row::Signed(v) => json!(v),
                Row::Unsigned(v) => json!(v),
            })
            .collect(),
    })
}

async fn embed(
    service: &Service,
    req: &EmbeddingRequest,
    types: &[(&'static str, Encoding)],
    ticket: &Ticket,
) -> Result<Vec<u8>, ApiError> {
    // Every type's calibration is checked before any work.
    let dims = req.dimensions.map_or(service.dimensions(), |d| d as usize);
    for (_, encoding) in types {
        service.ranges(*encoding, dims)?;
    }
    let e = service.embedded(req, "/v2/embed", ticket).await?;
    let mut embeddings = Map::new();
    for (name, encoding) in types {
        embeddings.insert(
            (*name).to_string(),
            Value::Array(rows_as(service, &e, *encoding)?),
        );
    }
    let texts = match &req.input {
        Input::Texts(t) => json!(t),
        Input::Ids(_) => json!([]),
    };
    bytes(&json!({
        "id": id(),
        "embeddings": embeddings,
        "texts": texts,
        "meta": meta(json!({"input_tokens": e.tokens})),
        "response_type": "embeddings_by_type",
    }))
}

/// A call of a Cohere route, answered in Cohere's shape.
pub async fn answer(
    service: &Service,
    call: Call,
    shape: Shape,
    ticket: &Ticket,
) -> Result<Vec<u8>, ApiError> {
    match (call, shape) {
        (Call::Embeddings(r), Shape::Embed { types }) => embed(service, &r, &types, ticket).await,
        (Call::Rerank(r), _) => {
            let (order, scores, _) = service.ranked(&r, ticket).await?;
            let results: Vec<Value> = order
                .iter()
                .map(|&i| match r.return_documents {
                    true => json!({"index": i, "relevance_score": scores[i],
                        "document": {"text": r.documents[i]}}),
                    false => json!({"index": i, "relevance_score": scores[i]}),
                })
                .collect();
            bytes(&json!({
                "id": id(),
                "results": results,
                "meta": meta(json!({"search_units": 1})),
            }))
        }
        _ => Err(ApiError::Internal {}),
    }
}
