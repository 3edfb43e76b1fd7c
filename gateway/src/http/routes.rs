//! Routes: the method, the key, the body's type and size, and the request metrics, recorded
//! however the request ends (a request whose client went away is counted as 499, nginx's
//! "client closed request": nobody reads that answer), with the parse and respond stages of a
//! POST answered 200.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Body as _;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::header::{HeaderValue, AUTHORIZATION, CONNECTION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response};

use crate::api::errors::ApiError;
use crate::api::request::{self, Call};
use crate::api::routes::{keyed, post_api, Api};
use crate::api::{cohere, openapi, tei};
use crate::app::gateway::Gateway;
use crate::app::service::Service;
use crate::app::{cohere as app_cohere, tei as app_tei};
use crate::http::auth::{self, KeyFile};
use crate::plan::admission;
use crate::telemetry::metrics::{Metrics, Stage};
use crate::telemetry::traces;

pub use crate::api::routes::route_of;

/// The code counted for a request whose client left before its answer (never sent).
const CLIENT_GONE: u16 = 499;

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
        if !self.finished && post_api(self.route).is_some() {
            self.metrics.cancelled_requests.inc();
        }
        self.metrics.inflight.dec();
        let seconds = self.start.elapsed().as_secs_f64();
        self.metrics
            .observe(self.route, self.status, self.model, seconds);
    }
}

type Reply = Response<Answer>;

/// A response's bytes; an answer's also time the respond stage until hyper takes them. The
/// answer's JSON is written as the service builds it, so the stage is the hand-off to the
/// connection.
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
                metrics.stage(Stage::Respond, start.elapsed().as_secs_f64());
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

fn respond(status: u16, body: impl Into<Bytes>, content_type: &'static str) -> Reply {
    let body = Answer {
        bytes: Full::new(body.into()),
        respond: None,
    };
    let mut r = Response::new(body);
    *r.status_mut() = hyper::StatusCode::from_u16(status).expect("a valid status");
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// A refusal as HTTP, in the shape of the route's API: the one place the catalog meets the wire.
fn error_reply(e: &ApiError, route: &'static str) -> Reply {
    let api = match route {
        "/info" => Some(Api::Tei),
        _ => post_api(route),
    };
    let (status, body) = match api {
        Some(Api::Tei) => (e.tei().0, e.tei_body()),
        Some(Api::Cohere) => (e.status(), e.cohere_body()),
        _ => (e.status(), e.body()),
    };
    let mut r = respond(status, body, "application/json");
    for (name, value) in e.headers() {
        if let Ok(v) = HeaderValue::from_str(&value) {
            r.headers_mut().insert(name, v);
        }
    }
    r
}

/// What answers requests: the gateway, its API keys, and its OpenAPI document.
pub struct Router {
    pub gateway: Arc<Gateway>,
    keys: Option<Arc<KeyFile>>,
    openapi: Bytes,
}

impl Router {
    pub fn new(gateway: Arc<Gateway>, keys: Option<Arc<KeyFile>>) -> Self {
        let openapi = Bytes::from(openapi::document(keys.is_some()));
        Router {
            gateway,
            keys,
            openapi,
        }
    }
}

/// Which API's shape answers a call.
enum Shape {
    OpenAi,
    Tei(tei::Shape),
    Cohere(cohere::Shape),
}

/// A parsed POST body: a call for the workers, or one of TEI's tokenizer requests.
enum Parsed {
    Call(Call, Shape),
    Tokenizer(tei::Tei),
}

pub async fn handle(router: Arc<Router>, req: Request<Incoming>) -> Result<Reply, Infallible> {
    let gateway = &router.gateway;
    let metrics = Arc::clone(&gateway.metrics);
    metrics.inflight.inc();
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
    let mut span = (gateway.tracer.enabled() && post_api(route).is_some()).then(|| {
        let parent = req
            .headers()
            .get("traceparent")
            .and_then(|v| v.to_str().ok());
        gateway
            .tracer
            .server(format!("{} {route}", req.method()), parent)
    });
    let context = span.as_ref().and_then(traces::Span::context);
    let mut body_read = req.body().is_end_stream();
    let answered = dispatch(&router, route, req, &mut recorder.model, &mut body_read);
    let mut reply = match traces::within(context, answered).await {
        Ok(reply) => reply,
        Err(e) => error_reply(&e, route),
    };
    if !body_read {
        // Answered before its body was read (a 401, 405, 413, ...): hyper would close the
        // connection after this reply without saying so, and a client that reuses it would
        // lose its next request. Said, the client opens a new one.
        reply
            .headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    recorder.status = reply.status().as_u16();
    recorder.finished = true;
    if let Some(span) = &mut span {
        span.int("http.response.status_code", i64::from(recorder.status));
    }
    Ok(reply)
}

async fn dispatch(
    router: &Router,
    route: &'static str,
    req: Request<Incoming>,
    served: &mut &'static str,
    body_read: &mut bool,
) -> Result<Reply, ApiError> {
    let gateway = &router.gateway;
    if let Some(file) = &router.keys {
        if keyed(req.uri().path()) {
            authorize(gateway, file, route, &req)?;
        }
    }
    let method = req.method().clone();
    if let Some(api) = post_api(route) {
        if method != Method::POST {
            return Err(ApiError::MethodNotAllowed {
                route,
                method: "POST",
                allow: "POST",
            });
        }
        return post(gateway, (route, api), req, served, body_read).await;
    }
    if method != Method::GET && method != Method::HEAD {
        return match route {
            "other" => Err(ApiError::NoRoute {
                path: req.uri().path().to_string(),
            }),
            _ => Err(ApiError::MethodNotAllowed {
                route,
                method: "GET",
                allow: "GET, HEAD",
            }),
        };
    }
    let json = "application/json";
    match route {
        "/health" => Ok(respond(200, br#"{"status":"ok"}"#.to_vec(), json)),
        // Holding requests (scale from zero), the gateway is ready without a worker.
        "/ready" if gateway.ready() => Ok(respond(200, br#"{"ready":true}"#.to_vec(), json)),
        "/ready" => Ok(respond(503, br#"{"ready":false}"#.to_vec(), json)),
        "/metrics" => Ok(respond(
            200,
            gateway.exposition(),
            "text/plain; version=0.0.4; charset=utf-8",
        )),
        "/v1/models" => Ok(respond(200, gateway.models(), json)),
        "/openapi.json" => Ok(respond(200, router.openapi.clone(), json)),
        "/info" => Ok(respond(200, app_tei::info(gateway.pick(None)?)?, json)),
        _ => Err(ApiError::NoRoute {
            path: req.uri().path().to_string(),
        }),
    }
}

/// The body of a POST route of `api` as a call or a tokenizer request; TEI's POST / as the
/// route the default model's task takes.
fn parse(gateway: &Gateway, (route, api): (&str, Api), body: &[u8]) -> Result<Parsed, ApiError> {
    Ok(match api {
        Api::OpenAi => Parsed::Call(request::parse_call(route, body)?, Shape::OpenAi),
        Api::Cohere => {
            let (call, shape) = cohere::parse(route, body)?;
            Parsed::Call(call, Shape::Cohere(shape))
        }
        Api::Tei => {
            let route = match route {
                "/" => app_tei::default_route(gateway.pick(tei::model_of(body)?.as_deref())?),
                r => r,
            };
            match tei::parse(route, body)? {
                tei::Tei::Call(call, shape) => Parsed::Call(call, Shape::Tei(shape)),
                other => Parsed::Tokenizer(other),
            }
        }
    })
}

/// A POST: read, parsed, then the served model the body names picks the service; then
/// admitted or shed, before any other check: the ticket gives its work back when dropped,
/// whether answered, refused or abandoned.
async fn post(
    gateway: &Gateway,
    (route, api): (&'static str, Api),
    req: Request<Incoming>,
    served: &mut &'static str,
    body_read: &mut bool,
) -> Result<Reply, ApiError> {
    let started = Instant::now();
    let settings = &gateway.settings;
    let body = read_body(settings.max_body_bytes, settings.body_timeout_seconds, req).await?;
    *body_read = true;
    let parsed = parse(gateway, (route, api), &body)?;
    let metrics = &gateway.metrics;
    metrics.stage(Stage::Parse, started.elapsed().as_secs_f64());
    let (call, shape) = match parsed {
        Parsed::Call(call, shape) => (call, shape),
        Parsed::Tokenizer(tei::Tei::Tokenize(r)) => {
            let service = gateway.pick(r.model.as_deref())?;
            *served = service.name;
            return Ok(respond(
                200,
                app_tei::tokenize(service, r).await?,
                "application/json",
            ));
        }
        Parsed::Tokenizer(tei::Tei::Decode(r)) => {
            let service = gateway.pick(r.model.as_deref())?;
            *served = service.name;
            return Ok(respond(
                200,
                app_tei::decode(service, &r)?,
                "application/json",
            ));
        }
        Parsed::Tokenizer(tei::Tei::Call(..)) => return Err(ApiError::Internal {}),
    };
    let service = gateway.pick(call.model())?;
    *served = service.name;
    let ticket = admit(service, &call)?;
    let doc = match shape {
        Shape::OpenAi => match call {
            Call::Embeddings(r) => service.embeddings(r, &ticket).await?,
            Call::Rerank(r) => service.rerank(r, &ticket).await?,
            Call::Score(r) => service.score(r, &ticket).await?,
            Call::Classify(r) => service.classify(r, &ticket).await?,
            Call::Sparse(r) => service.sparse_embeddings(r, &ticket).await?,
            Call::MultiVector(r) => service.multi_vector(r, &ticket).await?,
            Call::Hybrid(r) => service.hybrid(r, &ticket).await?,
        },
        Shape::Tei(shape) => app_tei::answer(service, call, shape, &ticket).await?,
        Shape::Cohere(shape) => app_cohere::answer(service, call, shape, &ticket).await?,
    };
    ticket.answered();
    let mut reply = respond(200, doc, "application/json");
    reply.body_mut().respond = Some((Arc::clone(metrics), Instant::now()));
    Ok(reply)
}

/// The call admitted by the work it asks for, or shed.
fn admit(service: &Service, call: &Call) -> Result<admission::Ticket, ApiError> {
    let (model, max_tokens) = (&service.model, service.tokenization.max_tokens);
    let gate = &service.admission;
    match call {
        Call::Embeddings(request::EmbeddingRequest {
            input,
            input_type,
            truncate,
            ..
        })
        | Call::Sparse(request::SparseRequest {
            input,
            input_type,
            truncate,
            ..
        })
        | Call::MultiVector(request::MultiVectorRequest {
            input,
            input_type,
            truncate,
            ..
        })
        | Call::Hybrid(request::HybridRequest {
            input,
            input_type,
            truncate,
            ..
        }) => gate.admit(admission::input_work(
            input,
            input_type.as_deref(),
            *truncate,
            model,
            max_tokens,
        )),
        Call::Rerank(r) => gate.admit(admission::rerank_work(r, model)),
        Call::Score(r) => gate.admit(admission::score_work(r, model)),
        Call::Classify(r) => gate.admit(admission::classify_work(r)),
    }
}

/// 401 unless the request carries a current API key; counts it per key when asked. Before the
/// method and the route: an unknown /v1/ path tells nothing without a key.
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
        .ok_or(if header.is_some() {
            ApiError::KeyWrong {}
        } else {
            ApiError::KeyMissing {}
        })?;
    if gateway.settings.api_key_metrics {
        gateway.metrics.count_key(&label, route);
    }
    Ok(())
}

async fn read_body(
    limit: usize,
    timeout_seconds: f64,
    req: Request<Incoming>,
) -> Result<Bytes, ApiError> {
    let over = ApiError::BodyTooLarge { limit };
    let headers = req.headers();
    if let Some(length) = headers.get(CONTENT_LENGTH) {
        let text = length.to_str().unwrap_or("");
        let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
        if digits && text.parse::<u128>().map_or(true, |n| n > limit as u128) {
            return Err(over);
        }
    }
    if headers
        .get_all(CONTENT_TYPE)
        .iter()
        .any(|v| !is_json(v.as_bytes()))
    {
        return Err(ApiError::NotJson {});
    }
    let deadline = std::time::Duration::from_secs_f64(timeout_seconds);
    let collected = tokio::time::timeout(deadline, Limited::new(req.into_body(), limit).collect());
    let Ok(collected) = collected.await else {
        return Err(ApiError::BodyTimeout {});
    };
    match collected {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(over),
        // The framing broke, or the body ended early: the client may still be reading.
        Err(e) => Err(ApiError::MalformedBody {
            reason: body_failure(&*e),
        }),
    }
}

/// What went wrong reading a body, in a client's words: it ended early (the client stopped
/// sending), or its chunked framing broke.
fn body_failure(e: &(dyn std::error::Error + 'static)) -> &'static str {
    let mut cause = Some(e);
    while let Some(c) = cause {
        let early = c
            .downcast_ref::<hyper::Error>()
            .is_some_and(|h| h.is_incomplete_message())
            || c.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof);
        if early {
            return "it ended before its declared length";
        }
        cause = c.source();
    }
    "its chunked framing is broken"
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
}
