//! The accept loop and HTTP/2 connections, on hyper directly rather than tonic's `Server`:
//! tonic's server wraps every call in its grpc-timeout layer, which ends an expired call as
//! CANCELLED ("Timeout expired"), racing the client's own DEADLINE_EXCEEDED; the Python front
//! (and gRPC's C core) answer DEADLINE_EXCEEDED, which service.rs does itself.
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::codegen::Service;
use tonic::service::Routes;
use tonic::Status;

use crate::service::TOO_LARGE;
use crate::stats::Stats;

/// Accepts until `stop` is set, then lets each connection finish its open calls (HTTP/2
/// GOAWAY: the client opens new ones elsewhere) and returns once all have closed.
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    stop: watch::Receiver<bool>,
    stats: Arc<Stats>,
) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(stop.clone()) => break,
        };
        match accepted {
            Ok((stream, _)) => {
                let stats = Arc::clone(&stats);
                connections.spawn(connection(stream, routes.clone(), stop.clone(), stats));
            }
            // Out of file descriptors or a connection reset before it was taken: the
            // listener itself is still good.
            Err(error) => {
                tracing::warn!(%error, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

async fn connection(
    stream: TcpStream,
    routes: Routes,
    stop: watch::Receiver<bool>,
    stats: Arc<Stats>,
) {
    // Small replies leave at once rather than waiting on Nagle's algorithm for more.
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |request: http::Request<Incoming>| {
        let mut routes = routes.clone();
        let stats = Arc::clone(&stats);
        async move {
            // "/embedfleet.v1.Worker/Embed": the method, for the count of refusals made here
            let method = request
                .uri()
                .path()
                .rsplit('/')
                .next()
                .unwrap_or("")
                .to_owned();
            // The router's own failures (none for gRPC routes) as a gRPC status: a concrete
            // error type here keeps the connection's future Send for any lifetime.
            let answered = routes.call(request.map(tonic::body::boxed)).await;
            let mut response =
                answered.unwrap_or_else(|e| Status::internal(e.to_string()).into_http());
            if exhausted_if_too_large(response.headers_mut()) {
                // Refused before the handler ran: counted here, as the handler counts the rest.
                stats.record(&method, tonic::Code::ResourceExhausted, None);
            }
            Ok::<_, Infallible>(response)
        }
    });
    let serving = http2::Builder::new(TokioExecutor::new())
        .timer(TokioTimer::new())
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(serving);
    tokio::select! {
        _ = serving.as_mut() => return,
        () = stopped(stop) => {}
    }
    serving.as_mut().graceful_shutdown();
    let _ = serving.await;
}

/// A unary call refused for its size answers in its headers (trailers-only): its status as the
/// Python front's (service::too_large_as_exhausted says why). True if it was one.
fn exhausted_if_too_large(headers: &mut http::HeaderMap) -> bool {
    let status = headers.get("grpc-status").and_then(|s| s.to_str().ok());
    if status != Some((tonic::Code::OutOfRange as i32).to_string().as_str()) {
        return false;
    }
    // grpc-message is percent-encoded: its spaces are %20.
    let message = headers.get("grpc-message").and_then(|m| m.to_str().ok());
    if message.is_some_and(|m| m.replace("%20", " ").contains(TOO_LARGE)) {
        let exhausted = (tonic::Code::ResourceExhausted as i32).to_string();
        if let Ok(value) = http::HeaderValue::from_str(&exhausted) {
            headers.insert("grpc-status", value);
        }
        return true;
    }
    false
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}
