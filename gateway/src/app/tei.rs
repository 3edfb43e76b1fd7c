//! TEI's answers: each call through the same service endpoints the OpenAI-style routes use,
//! written in TEI's shapes; /tokenize, /decode and /info from the served model alone.

use serde_json::{json, Map, Value};

use crate::api::errors::ApiError;
use crate::api::request::{field_error, Call};
use crate::api::tei::{DecodeRequest, Shape, TokenizeRequest};
use crate::app::service::Service;
use crate::model::dir::{Head, Task};
use crate::plan::admission::Ticket;

fn bytes(doc: &impl serde::Serialize) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(doc).map_err(|_| ApiError::Internal {})
}

/// A `prompt_name` must name one of the model's prompts (TEI refuses any other); a PyLate
/// ColBERT's two sides, "query" and "document", are its own.
fn check_prompt(service: &Service, name: Option<&str>) -> Result<(), ApiError> {
    let side = |n| service.model.pylate.is_some() && matches!(n, "query" | "document");
    match name {
        Some(n) if !service.model.prompts.contains_key(n) && !side(n) => Err(field_error(
            "prompt_name",
            "Input should name one of the model's prompts (config_sentence_transformers.json)",
        )),
        _ => Ok(()),
    }
}

/// Scores before the reranker's sigmoid, as TEI's `raw_scores` gives them: a cross-encoder's
/// logit; a cosine (an embedding model's relevance) is raw already.
fn raw(service: &Service, score: f32) -> f32 {
    match service.model.task {
        // A float32 sigmoid saturates at 0 and 1: their logits are kept finite.
        Task::Score => {
            let p = score.clamp(1e-7, 1.0 - 1e-7);
            (p / (1.0 - p)).ln()
        }
        _ => score,
    }
}

/// Label scores best first, as TEI's predictions.
fn predictions(row: &[f32], labels: &[String]) -> Vec<Value> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    order.sort_by(|&x, &y| {
        row[y]
            .partial_cmp(&row[x])
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    order
        .into_iter()
        .map(|k| json!({"score": row[k], "label": labels.get(k)}))
        .collect()
}

/// A call of a TEI route, answered in TEI's shape.
pub async fn answer(
    service: &Service,
    call: Call,
    shape: Shape,
    ticket: &Ticket,
) -> Result<Vec<u8>, ApiError> {
    match (call, shape) {
        (Call::Embeddings(r), _) => {
            check_prompt(service, r.input_type.as_deref())?;
            let e = service.embedded(&r, "/embed", ticket).await?;
            bytes(&e.rows.chunks(e.dims.max(1)).collect::<Vec<_>>())
        }
        (Call::MultiVector(r), _) => {
            check_prompt(service, r.input_type.as_deref())?;
            let (inputs, _) = service.token_vectors(&r, "/embed_all", ticket).await?;
            bytes(
                &inputs
                    .iter()
                    .map(|v| v.tokens().collect())
                    .collect::<Vec<Vec<_>>>(),
            )
        }
        (Call::Sparse(r), _) => {
            check_prompt(service, r.input_type.as_deref())?;
            let (rows, _) = service.sparse_rows(&r, "/embed_sparse", ticket).await?;
            let rows: Vec<Vec<Value>> = rows
                .iter()
                .map(|(ids, values)| {
                    let pairs = ids.iter().zip(values);
                    pairs
                        .map(|(i, v)| json!({"index": i, "value": v}))
                        .collect()
                })
                .collect();
            bytes(&rows)
        }
        (Call::Rerank(r), Shape::Rerank { raw: want_raw }) => {
            let (order, scores, _) = service.ranked(&r, ticket).await?;
            let ranks: Vec<Value> = order
                .iter()
                .map(|&i| {
                    let score = if want_raw {
                        raw(service, scores[i])
                    } else {
                        scores[i]
                    };
                    let text = r.return_documents.then(|| r.documents[i].as_str());
                    match text {
                        Some(t) => json!({"index": i, "text": t, "score": score}),
                        None => json!({"index": i, "score": score}),
                    }
                })
                .collect();
            bytes(&ranks)
        }
        (Call::Classify(r), Shape::Predict { single }) => {
            let (scores, _) = service.classified(&r, "/predict", ticket).await?;
            let labels = &service.model.labels;
            let mut rows = scores
                .chunks(labels.len().max(1))
                .map(|row| predictions(row, labels));
            match single {
                true => bytes(&rows.next().unwrap_or_default()),
                false => bytes(&rows.collect::<Vec<_>>()),
            }
        }
        (Call::Score(r), _) => bytes(&service.scored(&r, ticket).await?.0),
        _ => Err(ApiError::Internal {}),
    }
}

/// POST /tokenize: each input's tokens, with the prompt `prompt_name` names; on the tokenizer
/// threads, as the other routes' large tokenizations.
pub async fn tokenize(service: &Service, req: TokenizeRequest) -> Result<Vec<u8>, ApiError> {
    check_prompt(service, req.prompt_name.as_deref())?;
    let prompt = match &req.prompt_name {
        Some(name) => service.model.prompt_for(Some(name)).to_string(),
        None => String::new(),
    };
    let tokenization = std::sync::Arc::clone(&service.tokenization);
    let special = req.add_special_tokens;
    let work = move || -> Result<Vec<Vec<Value>>, ApiError> {
        let mut out = Vec::with_capacity(req.inputs.len());
        for text in &req.inputs {
            let text = format!("{prompt}{text}");
            let tokens = tokenization.tokens(&text, special)?.into_iter().map(|t| {
                let (start, stop) = t.span.unzip();
                json!({"id": t.id, "text": t.text, "special": t.special,
                    "start": start, "stop": stop})
            });
            out.push(tokens.collect());
        }
        Ok(out)
    };
    let tokens = tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| ApiError::Internal {})??;
    bytes(&tokens)
}

/// POST /decode: each list of ids as text.
pub fn decode(service: &Service, req: &DecodeRequest) -> Result<Vec<u8>, ApiError> {
    let texts = service
        .tokenization
        .decode(&req.ids, req.skip_special_tokens)?;
    bytes(&texts)
}

/// The route POST / takes for this model, as TEI routes it by the model's type.
pub fn default_route(service: &Service) -> &'static str {
    match service.model.task {
        // A hybrid model's dense vectors, as the same model served as an embedder.
        Task::Embed | Task::Hybrid => "/embed",
        Task::Sparse => "/embed_sparse",
        Task::Score => "/rerank",
        Task::Classify => "/predict",
        Task::MultiVector => "/embed_all",
    }
}

/// GET /info: TEI's description of the served model and the gateway's limits.
pub fn info(service: &Service) -> Result<Vec<u8>, ApiError> {
    let labels = || {
        let ids: Map<String, Value> = (service.model.labels.iter().enumerate())
            .map(|(i, l)| (i.to_string(), json!(l)))
            .collect();
        let names: Map<String, Value> = (service.model.labels.iter().enumerate())
            .map(|(i, l)| (l.clone(), json!(i)))
            .collect();
        json!({"id2label": ids, "label2id": names})
    };
    let model_type = match (service.model.task, service.model.head) {
        (Task::Classify, _) => json!({"classifier": labels()}),
        (Task::Score, Head::YesNo) => json!({"reranker": {"id2label": {}, "label2id": {}}}),
        (Task::Score, _) => json!({"reranker": labels()}),
        (Task::Sparse, Head::Lexical) => json!({"embedding": {"pooling": "lexical"}}),
        (Task::Sparse, _) => json!({"embedding": {"pooling": "splade"}}),
        (Task::MultiVector, _) => json!({"embedding": {"pooling": "none"}}),
        (Task::Embed | Task::Hybrid, _) => json!({"embedding": {"pooling": "model"}}),
    };
    let s = &service.settings;
    bytes(&json!({
        "model_id": service.name,
        "model_sha": null,
        "model_dtype": "auto",
        "model_type": model_type,
        "prompts": service.model.prompts,
        "max_concurrent_requests": s.max_connections,
        "max_input_length": service.tokenization.max_tokens,
        "max_batch_tokens": s.max_request_tokens,
        "max_batch_requests": null,
        "max_client_batch_size": s.max_client_batch,
        "auto_truncate": false,
        "tokenization_workers": s.tokenize_threads,
        "version": env!("CARGO_PKG_VERSION"),
        "sha": null,
        "docker_label": null,
    }))
}
