//! The HTTP layer (the Python gateway's app.py): routes, methods, the body's type and size, and
//! the request metrics, recorded however the request ends (a client that goes away is 499),
//! with the parse and respond stages of a POST answered 200.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response};

use crate::admission;
use crate::auth;
use crate::errors::{self, ApiError};
use crate::gateway::Gateway;
use crate::metrics::{self, Metrics};
use crate::request;
use crate::trace;

/// nginx's "client closed request", for metrics: nobody reads this response.
const CLIENT_GONE: u16 = 499;
const POSTS: [&str; 5] = [
    "/v1/embeddings",
    "/v1/rerank",
    "/v1/score",
    "/v1/classify",
    "/v1/sparse_embeddings",
];
const GETS: [&str; 5] = [
    "/health",
    "/ready",
    "/metrics",
    "/openapi.json",
    "/v1/models",
];

/// The route label of a path: itself when it is a route, else "other" (few series).
pub fn route_of(path: &str) -> &'static str {
    POSTS
        .iter()
        .chain(GETS.iter())
        .find(|r| **r == path)
        .copied()
        .unwrap_or("other")
}

/// application/json or a +json type, any parameters; a body without a type is read as JSON.
pub fn is_json(content_type: &[u8]) -> bool {
    let media = content_type.split(|&b| b == b';').next().unwrap_or(b"");
    let media = String::from_utf8_lossy(media).trim().to_ascii_lowercase();
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

/// Counts the request when it ends, with 499 when its future was dropped (the client left:
/// a POST is then a cancelled request, its chunks' calls dropped with it).
struct Recorder {
    metrics: Arc<Metrics>,
    route: &'static str,
    /// the served model that took the request ("" until one did)
    model: &'static str,
    start: Instant,
    status: u16,
    finished: bool,
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.finished && POSTS.contains(&self.route) {
            self.metrics.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.inflight.fetch_sub(1, Ordering::Relaxed);
        let seconds = self.start.elapsed().as_secs_f64();
        self.metrics
            .observe(self.route, self.status, self.model, seconds);
    }
}

type Reply = Response<Answer>;

/// A response's bytes; an answer's also time the respond stage until hyper takes them. The
/// answer's JSON is written as the service builds it, so the stage is the hand-off to the
/// connection (the Python gateway's also covers orjson's encoding).
pub struct Answer {
    bytes: Full<Bytes>,
    respond: Option<(Arc<Metrics>, Instant)>,
}

impl hyper::body::Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let polled = Pin::new(&mut self.bytes).poll_frame(cx);
        if polled.is_ready() {
            if let Some((metrics, start)) = self.respond.take() {
                metrics.stage(metrics::RESPOND, start.elapsed().as_secs_f64());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.bytes.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.bytes.size_hint()
    }
}

fn respond(status: u16, body: Vec<u8>, content_type: &'static str) -> Reply {
    let body = Answer {
        bytes: Full::new(Bytes::from(body)),
        respond: None,
    };
    let mut r = Response::new(body);
    *r.status_mut() = hyper::StatusCode::from_u16(status).expect("a valid status");
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn error_reply(e: &ApiError) -> Reply {
    let mut r = respond(e.status, e.body(), "application/json");
    for (name, value) in &e.headers {
        if let Ok(v) = HeaderValue::from_str(value) {
            r.headers_mut().insert(*name, v);
        }
    }
    r
}

/// A parsed POST body, by route.
enum Post {
    Embeddings(request::EmbeddingRequest),
    Rerank(request::RerankRequest),
    Score(request::ScoreRequest),
    Classify(request::ClassifyRequest),
    Sparse(request::SparseRequest),
}

impl Post {
    /// The body's `model`, which names the served model to answer it.
    fn model(&self) -> Option<&str> {
        match self {
            Post::Embeddings(r) => r.model.as_deref(),
            Post::Rerank(r) => r.pair.model.as_deref(),
            Post::Score(r) => r.pair.model.as_deref(),
            Post::Classify(r) => r.model.as_deref(),
            Post::Sparse(r) => r.model.as_deref(),
        }
    }
}

pub async fn handle(gateway: Arc<Gateway>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let metrics = Arc::clone(&gateway.metrics);
    metrics.inflight.fetch_add(1, Ordering::Relaxed);
    let route = route_of(req.uri().path());
    let mut recorder = Recorder {
        metrics,
        route,
        model: "",
        start: Instant::now(),
        status: CLIENT_GONE,
        finished: false,
    };
    // Only the API routes are traced: probes and scrapes of /ready and /metrics are not.
    let mut span = (gateway.tracer.enabled() && POSTS.contains(&route)).then(|| {
        let parent = req
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok());
        gateway
            .tracer
            .server(format!("{} {route}", req.method()), parent)
    });
    let context = span.as_ref().and_then(trace::Span::context);
    let answered = dispatch(&gateway, route, req, &mut recorder.model);
    let reply = match trace::within(context, answered).await {
        Ok(reply) => reply,
        Err(e) => error_reply(&e),
    };
    recorder.status = reply.status().as_u16();
    recorder.finished = true;
    if let Some(span) = &mut span {
        span.int("http.response.status_code", i64::from(recorder.status));
    }
    Ok(reply)
}

async fn dispatch(
    gateway: &Gateway,
    route: &'static str,
    req: Request<Incoming>,
    served: &mut &'static str,
) -> Result<Reply, ApiError> {
    if let Some(file) = &gateway.keys {
        if req.uri().path().starts_with("/v1/") {
            authorize(gateway, file, route, &req)?;
        }
    }
    let method = req.method().clone();
    if POSTS.contains(&route) {
        if method != Method::POST {
            return Err(errors::not_allowed(
                format!("Use POST for {route}."),
                "POST",
            ));
        }
        let started = Instant::now();
        let body = read_body(
            gateway.settings.max_body_bytes,
            gateway.settings.body_timeout_seconds,
            req,
        )
        .await?;
        let post = match route {
            "/v1/rerank" => Post::Rerank(request::parse_rerank(&body)?),
            "/v1/score" => Post::Score(request::parse_score(&body)?),
            "/v1/classify" => Post::Classify(request::parse_classify(&body)?),
            "/v1/sparse_embeddings" => Post::Sparse(request::parse_sparse(&body)?),
            _ => Post::Embeddings(request::parse(&body)?),
        };
        let metrics = &gateway.metrics;
        metrics.stage(metrics::PARSE, started.elapsed().as_secs_f64());
        // The served model the body names picks the service; then admitted or shed, before
        // any other check (as the Python gateway): the ticket gives its work back when dropped,
        // whether answered, refused or abandoned.
        let service = gateway.pick(post.model())?;
        *served = service.name;
        let (model, max_tokens) = (&service.model, service.tokenization.max_tokens);
        let gate = &service.admission;
        let ticket = match &post {
            Post::Embeddings(r) => gate.admit(admission::embedding_work(r, model, max_tokens))?,
            Post::Rerank(r) => gate.admit(admission::rerank_work(r, model))?,
            Post::Score(r) => gate.admit(admission::score_work(r, model))?,
            Post::Classify(r) => gate.admit(admission::classify_work(r))?,
            Post::Sparse(r) => gate.admit(admission::sparse_work(r, model, max_tokens))?,
        };
        let doc = match post {
            Post::Embeddings(r) => service.embeddings(r, &ticket).await?,
            Post::Rerank(r) => service.rerank(r, &ticket).await?,
            Post::Score(r) => service.score(r, &ticket).await?,
            Post::Classify(r) => service.classify(r, &ticket).await?,
            Post::Sparse(r) => service.sparse_embeddings(r, &ticket).await?,
        };
        ticket.answered();
        let mut reply = respond(200, doc, "application/json");
        reply.body_mut().respond = Some((Arc::clone(metrics), Instant::now()));
        return Ok(reply);
    }
    if GETS.contains(&route) {
        if method != Method::GET && method != Method::HEAD {
            return Err(errors::not_allowed(
                format!("Use GET for {route}."),
                "GET, HEAD",
            ));
        }
        return match route {
            "/health" => Ok(respond(
                200,
                br#"{"status":"ok"}"#.to_vec(),
                "application/json",
            )),
            // Holding requests (scale from zero), the gateway is ready without a worker.
            "/ready" if gateway.ready() => Ok(respond(
                200,
                br#"{"ready":true}"#.to_vec(),
                "application/json",
            )),
            "/ready" => Ok(respond(
                503,
                br#"{"ready":false}"#.to_vec(),
                "application/json",
            )),
            "/metrics" => Ok(respond(
                200,
                gateway.exposition().into_bytes(),
                "text/plain; version=0.0.4; charset=utf-8",
            )),
            "/v1/models" => Ok(respond(200, gateway.models(), "application/json")),
            // The Python gateway's document, generated from its schemas (openapi.py writes
            // these copies; tests/gateway_rs compares what both serve).
            "/openapi.json" if gateway.keys.is_some() => Ok(respond(
                200,
                include_bytes!("../openapi/auth.json").to_vec(),
                "application/json",
            )),
            "/openapi.json" => Ok(respond(
                200,
                include_bytes!("../openapi/open.json").to_vec(),
                "application/json",
            )),
            _ => Err(errors::unsupported(&format!("GET {route}"))),
        };
    }
    Err(errors::not_found(format!("No route {}.", req.uri().path())).code("not_found"))
}

/// 401 unless the request carries a current API key; counts it per key when asked. Before the
/// method and the route, as the Python gateway: an unknown /v1/ path tells nothing without a key.
fn authorize(
    gateway: &Gateway,
    file: &auth::KeyFile,
    route: &'static str,
    req: &Request<Incoming>,
) -> Result<(), ApiError> {
    let header = req.headers().get(AUTHORIZATION).map(HeaderValue::as_bytes);
    let token = auth::bearer(header);
    let label = file
        .keys()
        .check(token.as_deref())
        .ok_or_else(|| errors::unauthorized(header.is_some()))?;
    if gateway.settings.api_key_metrics {
        gateway.metrics.count_key(label, route);
    }
    Ok(())
}

async fn read_body(
    limit: usize,
    timeout_seconds: f64,
    req: Request<Incoming>,
) -> Result<Bytes, ApiError> {
    let over = || {
        errors::too_large(format!(
            "The request body is over the limit of {limit} bytes."
        ))
    };
    let headers = req.headers();
    if let Some(length) = headers.get(CONTENT_LENGTH) {
        let text = length.to_str().unwrap_or("");
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        if digits && text.parse::<u128>().map_or(true, |n| n > limit as u128) {
            return Err(over());
        }
    }
    for value in headers.get_all(CONTENT_TYPE) {
        if !is_json(value.as_bytes()) {
            return Err(ApiError::new(
                415,
                "The request body must be JSON (Content-Type: application/json).",
            )
            .code("unsupported_media_type"));
        }
    }
    let deadline = std::time::Duration::from_secs_f64(timeout_seconds);
    let collected = tokio::time::timeout(deadline, Limited::new(req.into_body(), limit).collect());
    let Ok(collected) = collected.await else {
        return Err(
            ApiError::new(408, "The request body did not arrive in time.")
                .code("request_timeout")
                .header("connection", "close"),
        );
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(over()),
        // The connection broke mid-body: the client is gone, nobody reads this.
        Err(_) => Err(ApiError::new(CLIENT_GONE, "The client went away.")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_media_types() {
        assert!(is_json(b"application/json"));
        assert!(is_json(b"Application/JSON; charset=utf-8"));
        assert!(is_json(b"application/vnd.api+json"));
        assert!(!is_json(b"text/plain"));
        assert!(!is_json(b"application/x-www-form-urlencoded"));
    }

    #[test]
    fn routes() {
        assert_eq!(route_of("/v1/embeddings"), "/v1/embeddings");
        assert_eq!(route_of("/v1/embeddings/"), "other");
        assert_eq!(route_of("/ready"), "/ready");
    }
}
