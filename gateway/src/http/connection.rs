//! Bounds on slow, stalled, idle and malformed clients: a request's headers must arrive within
//! `--header-timeout-seconds` of the connection opening (or of the next request's first byte), else
//! 408 and the connection closes; an idle kept-alive connection closes after
//! `--keep-alive-seconds`; past `--max-connections` open connections a new one is answered 503 and
//! closed at once, before the file descriptors run out. The body's own deadline is the router's:
//! only it reads the body.
//!
//! hyper answers a request it cannot parse (a bad request line, headers past `--max-header-bytes`
//! or `--max-headers`) itself, with an empty body; the socket wrapper sends the catalog's refusal
//! in its place (`hyper_refusal`). A connection closed after a refusal reads what the client still
//! sends for a moment first (`linger`), so that the client reads the refusal rather than a reset.
//!
//! hyper's own `header_read_timeout` closes a stalled head without a response and counts an idle
//! kept-alive connection against the same bound, so the bounds are kept here instead: the socket is
//! wrapped (`Watched`) to see a request's first byte and to end the connection on a deadline, and
//! the connection's task sleeps until its next deadline. Each connection's deadlines are drawn from
//! the last `SPREAD` of their bound: with one fixed bound, connections opened in one burst are
//! closed, and reopened, in one burst.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::api::errors::ApiError;

/// The fraction of a bound its deadlines are spread over, below the bound itself.
pub const SPREAD: f64 = 0.1;
/// File descriptors kept out of --max-connections: worker channels, the log, the listener.
pub const FD_RESERVE: u64 = 64;

/// One connection's deadline for `bound`, from `draw` uniform in [0, 1): never past the bound,
/// never sooner than `1 - SPREAD` of it.
pub fn spread(bound: f64, draw: f64) -> f64 {
    bound * (1.0 - SPREAD * draw)
}

/// When a connection opened at `opened` says `Connection: close` on its next response
/// (--max-connection-age-seconds, spread as the other bounds; 0: never), so that its client
/// reconnects and a Service spreads clients over the gateway pods a rollout or scale-up added.
pub fn close_after(opened: Instant, max_age_seconds: f64, draw: f64) -> Option<Instant> {
    (max_age_seconds > 0.0)
        .then(|| opened + Duration::from_secs_f64(spread(max_age_seconds, draw).max(0.0)))
}

/// A response of a connection past its age says `Connection: close`: hyper then closes the
/// connection once it is written, and the client never sends on a closing socket.
pub fn age_out(headers: &mut hyper::HeaderMap, close_after: Option<Instant>) {
    if close_after.is_some_and(|at| Instant::now() >= at) {
        headers.insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("close"),
        );
    }
}

/// --max-connections (0: no cap of its own), kept below the open-file limit so that refusing
/// stays possible.
pub fn connection_cap(wanted: u64, open_files: u64) -> u64 {
    let room = open_files.saturating_sub(FD_RESERVE).max(1);
    if wanted > 0 {
        wanted.min(room)
    } else {
        room
    }
}

/// The soft open-file limit from a /proc/self/limits text (None if the line is missing;
/// "unlimited" reads as 2^20).
pub fn open_files_limit(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let soft = line["Max open files".len()..].split_whitespace().next()?;
    if soft == "unlimited" {
        Some(1 << 20)
    } else {
        soft.parse().ok()
    }
}

pub fn too_many() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| ApiError::TooManyConnections {}.close_response())
}

fn headers_too_slow() -> &'static [u8] {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    BYTES.get_or_init(|| ApiError::HeadersTimeout {}.close_response())
}

/// The refusal to send in place of what hyper wrote, when `written` starts a response hyper
/// made itself: a 4xx status line whose head has no content-type (every response the router
/// makes has one). Pure.
pub fn hyper_refusal(written: &[u8], limits: (usize, usize)) -> Option<ApiError> {
    let status = written.strip_prefix(b"HTTP/1.1 4")?;
    let head_end = written
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(written.len());
    let head = String::from_utf8_lossy(&written[..head_end]).to_ascii_lowercase();
    if head.contains("\ncontent-type:") {
        return None;
    }
    Some(match status.get(..2) {
        Some(b"31") => ApiError::HeadersTooLarge {
            bytes: limits.0,
            count: limits.1,
        },
        Some(b"14") => ApiError::UriTooLong {},
        _ => ApiError::MalformedRequest {},
    })
}

/// How long, and how much, a refused connection is read before it closes.
const LINGER: Duration = Duration::from_secs(2);
const LINGER_BYTES: usize = 1 << 20;

/// Reads and drops what the client still sends, for a moment, then closes: closing with unread
/// bytes would reset the connection, and the client could lose the refusal just written.
async fn linger(mut stream: TcpStream) {
    let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
    let mut buf = vec![0u8; 16 * 1024];
    let mut read = 0;
    let drain = async {
        while read < LINGER_BYTES {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read += n,
            }
        }
    };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

/// What a connection is doing, for its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Opened, or a request's first byte came after an idle spell: the header bound runs.
    Head,
    /// A request is being handled: no bound here (the body's and the workers' are their own).
    Busy,
    /// Answered, waiting for the next request: the keep-alive bound runs.
    Idle,
}

/// What the deadline calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// 408 and close.
    SlowHead,
    /// Close, saying nothing.
    IdleTooLong,
}

/// One connection's bounds, their spread already drawn.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub header: Duration,
    pub keep_alive: Duration,
}

impl Bounds {
    pub fn drawn(header_seconds: f64, keep_alive_seconds: f64, draw: f64) -> Self {
        Bounds {
            header: Duration::from_secs_f64(spread(header_seconds, draw).max(0.0)),
            keep_alive: Duration::from_secs_f64(spread(keep_alive_seconds, draw).max(0.0)),
        }
    }

    /// Pure: when a connection in `phase` since `since` is due, if ever.
    pub fn deadline(&self, phase: Phase, since: Duration) -> Option<Duration> {
        match phase {
            Phase::Head => Some(since + self.header),
            Phase::Idle => Some(since + self.keep_alive),
            Phase::Busy => None,
        }
    }

    /// Pure: what is due at `now` for a connection in `phase` since `since`.
    pub fn due(&self, phase: Phase, since: Duration, now: Duration) -> Option<Expiry> {
        match self.deadline(phase, since) {
            Some(at) if now >= at => Some(match phase {
                Phase::Head => Expiry::SlowHead,
                _ => Expiry::IdleTooLong,
            }),
            _ => None,
        }
    }
}

fn clock() -> Duration {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed()
}

const HEAD: u8 = 0;
const BUSY: u8 = 1;
const IDLE: u8 = 2;
const LIVE: u8 = 0;
const SLOW_HEAD: u8 = 1;
const CLOSE: u8 = 2;
const ENDED: u8 = 3;

/// A connection's phase, shared by its socket wrapper, its handler and its task.
pub struct Watch {
    phase: AtomicU8,
    since_nanos: AtomicU64,
    end: AtomicU8,
    changed: Notify,
}

impl Watch {
    pub fn new() -> Arc<Self> {
        Arc::new(Watch {
            phase: AtomicU8::new(HEAD),
            since_nanos: AtomicU64::new(clock().as_nanos() as u64),
            end: AtomicU8::new(LIVE),
            changed: Notify::new(),
        })
    }

    pub fn phase(&self) -> (Phase, Duration) {
        let phase = match self.phase.load(Ordering::Acquire) {
            HEAD => Phase::Head,
            BUSY => Phase::Busy,
            _ => Phase::Idle,
        };
        (
            phase,
            Duration::from_nanos(self.since_nanos.load(Ordering::Acquire)),
        )
    }

    fn enter(&self, phase: u8) {
        self.since_nanos
            .store(clock().as_nanos() as u64, Ordering::Release);
        self.phase.store(phase, Ordering::Release);
        self.changed.notify_one();
    }

    /// A response still going out to a slow reader is not idle: its bound starts after.
    fn wrote(&self, written: &Poll<io::Result<usize>>) {
        if matches!(written, Poll::Ready(Ok(n)) if *n > 0)
            && self.phase.load(Ordering::Acquire) == IDLE
        {
            self.since_nanos
                .store(clock().as_nanos() as u64, Ordering::Release);
        }
    }

    /// The handler runs from here until the guard drops (its response is then being written).
    pub fn busy(self: &Arc<Self>) -> BusyGuard {
        self.phase.store(BUSY, Ordering::Release);
        BusyGuard(Arc::clone(self))
    }

    /// The connection's task: serve `conn` until it ends, ending it on a due deadline.
    pub async fn guard<F: std::future::Future>(&self, bounds: Bounds, conn: F) {
        tokio::pin!(conn);
        loop {
            let (phase, since) = self.phase();
            let sleep = async {
                match bounds.deadline(phase, since) {
                    Some(at) => tokio::time::sleep(at.saturating_sub(clock())).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = self.changed.notified() => {}
                _ = sleep => {
                    let (phase, since) = self.phase();
                    match bounds.due(phase, since, clock()) {
                        Some(Expiry::SlowHead) => self.end.store(SLOW_HEAD, Ordering::Release),
                        Some(Expiry::IdleTooLong) => self.end.store(CLOSE, Ordering::Release),
                        None => continue,
                    }
                    // hyper is waiting for bytes in both phases: its next read ends it. A
                    // response stuck on a client that reads nothing is dropped after one bound.
                    let _ = tokio::time::timeout(bounds.keep_alive.max(Duration::from_secs(1)), conn)
                        .await;
                    return;
                }
            }
        }
    }
}

pub struct BusyGuard(Arc<Watch>);

impl Drop for BusyGuard {
    fn drop(&mut self) {
        self.0.enter(IDLE);
    }
}

/// The socket as hyper sees it: a read after an idle spell starts the header bound, once a
/// deadline has ended the connection a read writes its response (408 or nothing) and is EOF,
/// and a response hyper made itself goes out as the catalog's refusal.
pub struct Watched {
    /// None only once dropped
    inner: Option<TcpStream>,
    watch: Arc<Watch>,
    /// --max-header-bytes and --max-headers, for the 431's message
    limits: (usize, usize),
    /// the refusal sent in place of hyper's response, and how much of it is written: from
    /// then on, what hyper writes is dropped
    owed: Option<(Vec<u8>, usize)>,
    /// the last response written was a refusal: its client gets a moment to read it
    refused: bool,
}

impl Watched {
    pub fn new(inner: TcpStream, watch: Arc<Watch>, limits: (usize, usize)) -> Self {
        Watched {
            inner: Some(inner),
            watch,
            limits,
            owed: None,
            refused: false,
        }
    }

    fn stream(&mut self) -> Pin<&mut TcpStream> {
        Pin::new(self.inner.as_mut().expect("open until dropped"))
    }

    /// Notes the status of a response starting in `first` (the start of a write); takes over
    /// hyper's own.
    fn starting(&mut self, first: &[u8]) {
        if self.owed.is_some() || !first.starts_with(b"HTTP/1.1 ") {
            return;
        }
        self.refused = first.starts_with(b"HTTP/1.1 4") || first.starts_with(b"HTTP/1.1 5");
        if let Some(refusal) = hyper_refusal(first, self.limits) {
            self.owed = Some((refusal.close_response(), 0));
        }
    }

    /// Writes what is owed; ready once all of it is out.
    fn pay(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Watched { inner, owed, .. } = self;
        let (Some(stream), Some((bytes, done))) = (inner.as_mut(), owed.as_mut()) else {
            return Poll::Ready(Ok(()));
        };
        while *done < bytes.len() {
            match std::task::ready!(Pin::new(&mut *stream).poll_write(cx, &bytes[*done..])) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => *done += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let lingers = self.refused || self.watch.end.load(Ordering::Acquire) == ENDED;
        if let (true, Some(stream)) = (lingers, self.inner.take()) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(linger(stream));
            }
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.watch.end.load(Ordering::Acquire) {
            LIVE => {}
            end => {
                if end != ENDED {
                    // Once, best effort: a client that reads nothing may miss the 408, and is
                    // closed all the same. The FIN goes now, whatever hyper does with the EOF.
                    self.watch.end.store(ENDED, Ordering::Release);
                    if end == SLOW_HEAD {
                        let _ = self.stream().poll_write(cx, headers_too_slow());
                    }
                    let _ = self.stream().poll_shutdown(cx);
                }
                return Poll::Ready(Ok(()));
            }
        }
        let before = buf.filled().len();
        let polled = self.stream().poll_read(cx, buf);
        if buf.filled().len() > before && self.watch.phase.load(Ordering::Acquire) == IDLE {
            self.watch.enter(HEAD);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.starting(data);
        if self.owed.is_some() {
            return self.pay(cx).map_ok(|()| data.len());
        }
        let written = self.stream().poll_write(cx, data);
        self.watch.wrote(&written);
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.pay(cx))?;
        self.stream().poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        std::task::ready!(self.pay(cx))?;
        self.stream().poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(first) = bufs.iter().find(|b| !b.is_empty()) {
            self.starting(first);
        }
        if self.owed.is_some() {
            let total = bufs.iter().map(|b| b.len()).sum();
            return self.pay(cx).map_ok(|()| total);
        }
        let written = self.stream().poll_write_vectored(cx, bufs);
        self.watch.wrote(&written);
        written
    }

    fn is_write_vectored(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_past_its_age_says_close_and_no_age_never_does() {
        let opened = Instant::now() - Duration::from_secs(10);
        let mut headers = hyper::HeaderMap::new();
        age_out(&mut headers, close_after(opened, 20.0, 0.5));
        assert!(headers.get(hyper::header::CONNECTION).is_none()); // 19 s: not yet
        age_out(&mut headers, close_after(opened, 0.0, 0.5));
        assert!(headers.get(hyper::header::CONNECTION).is_none()); // 0: never
        age_out(&mut headers, close_after(opened, 10.5, 0.9)); // drawn 9.555 s
        assert_eq!(headers[hyper::header::CONNECTION], "close");
    }

    #[test]
    fn spread_stays_within_the_last_tenth_of_the_bound() {
        assert_eq!(spread(10.0, 0.0), 10.0);
        assert!((spread(10.0, 0.999_999) - 9.0).abs() < 1e-4);
        let draws: Vec<f64> = (0..1000).map(|_| fastrand::f64()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let spread_out = draws.iter().cloned().fold(f64::NAN, f64::max)
            - draws.iter().cloned().fold(f64::NAN, f64::min);
        assert!(spread_out > 0.9, "draws bunched: {spread_out}");
    }

    #[test]
    fn the_cap_stays_below_the_open_file_limit() {
        assert_eq!(connection_cap(4096, 1024), 1024 - 64);
        assert_eq!(connection_cap(100, 1024), 100);
        assert_eq!(connection_cap(0, 20000), 20000 - 64);
        assert_eq!(connection_cap(4096, 10), 1);
    }

    #[test]
    fn the_open_file_limit_is_the_soft_one() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max cpu time              unlimited            unlimited            seconds   \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(open_files_limit(limits), Some(1024));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(open_files_limit(unlimited), Some(1 << 20));
        assert_eq!(open_files_limit("Max processes 10 10 processes\n"), None);
    }

    #[test]
    fn a_head_is_due_at_the_header_bound_and_an_idle_connection_at_keep_alive() {
        let b = Bounds {
            header: Duration::from_secs(10),
            keep_alive: Duration::from_secs(5),
        };
        let t = Duration::from_secs(100);
        assert_eq!(b.due(Phase::Head, t, t + Duration::from_secs(9)), None);
        assert_eq!(
            b.due(Phase::Head, t, t + Duration::from_secs(10)),
            Some(Expiry::SlowHead)
        );
        assert_eq!(b.due(Phase::Idle, t, t + Duration::from_secs(4)), None);
        assert_eq!(
            b.due(Phase::Idle, t, t + Duration::from_secs(5)),
            Some(Expiry::IdleTooLong)
        );
        assert_eq!(b.due(Phase::Busy, t, t + Duration::from_secs(1000)), None);
        assert_eq!(b.deadline(Phase::Busy, t), None);
    }

    #[test]
    fn hyper_s_own_responses_become_refusals_and_the_router_s_stay() {
        let limits = (65536, 100);
        let own = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert!(matches!(
            hyper_refusal(own, limits),
            Some(ApiError::HeadersTooLarge {
                bytes: 65536,
                count: 100
            })
        ));
        let bad = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            hyper_refusal(bad, limits),
            Some(ApiError::MalformedRequest {})
        );
        let routed = b"HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n\r\n{}";
        assert_eq!(hyper_refusal(routed, limits), None);
        assert_eq!(
            hyper_refusal(b"HTTP/1.1 100 Continue\r\n\r\n", limits),
            None
        );
        assert_eq!(hyper_refusal(b"HTTP/1.1 200 OK\r\n\r\n", limits), None);
        let slow = String::from_utf8(headers_too_slow().to_vec()).unwrap();
        assert!(slow.starts_with("HTTP/1.1 408 Request Timeout\r\n"));
        let many = String::from_utf8(too_many().to_vec()).unwrap();
        assert!(many.contains(r#""code":"too_many_connections""#));
    }
}
