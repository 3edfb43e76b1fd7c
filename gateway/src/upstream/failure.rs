//! What a failed worker call means: whether another worker may take it (`retryable`), whether
//! the worker is broken (`ejects`), and what the client is told (`client_error`). Pure.

use tonic::{Code, Status};

use crate::api::errors::ApiError;

/// What a call given up on a hung worker fails with: retryable elsewhere, and ejecting.
pub fn stopped_answering() -> Status {
    Status::unavailable("the worker stopped answering")
}

/// gRPC's name of a status code (the 502's message and the logs carry it).
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// A peer that dies mid-stream can surface as INTERNAL/UNKNOWN with a transport message, or
/// (tonic) as UNKNOWN made from the transport's own error, which a status a worker sent never
/// carries: a connection the worker closed while stopping reads "error reading a body from
/// connection" with no status of the worker's at all.
pub fn broken_connection(status: &Status) -> bool {
    let text = status.message().to_lowercase();
    matches!(status.code(), Code::Internal | Code::Unknown)
        && (std::error::Error::source(status).is_some()
            || ["rst_stream", "socket closed", "connection reset", "goaway"]
                .iter()
                .any(|s| text.contains(s)))
}

/// tonic reports its own client-side timeout as CANCELLED "Timeout expired"; gRPC calls that
/// DEADLINE_EXCEEDED: a 504, not retried elsewhere, where it would only wait out the bound again.
pub fn deadline_as_such(status: Status) -> Status {
    if status.code() == Code::Cancelled && status.message() == tonic::TimeoutExpired(()).to_string()
    {
        Status::deadline_exceeded(status.message().to_string())
    } else {
        status
    }
}

/// The worker never ran the chunk, or died: it may succeed elsewhere.
pub fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::ResourceExhausted | Code::Cancelled
    ) || broken_connection(status)
}

/// The worker (or the connection to it) is broken, not merely busy.
pub fn ejects(status: &Status) -> bool {
    status.code() == Code::Unavailable || broken_connection(status)
}

/// What the client is told of a call that failed with `status`.
pub fn client_error(status: &Status, retry_after: u64) -> ApiError {
    match status.code() {
        Code::InvalidArgument => ApiError::WorkerRejected {
            detail: status.message().to_string(),
        },
        Code::ResourceExhausted => ApiError::WorkerBusy { retry_after },
        Code::DeadlineExceeded => ApiError::WorkerTimeout {},
        code => ApiError::WorkerFailed {
            code: code_name(code),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tonics_own_timeout_is_a_deadline_and_not_retried() {
        let timed_out = deadline_as_such(Status::from_error(Box::new(tonic::TimeoutExpired(()))));
        assert_eq!(timed_out.code(), Code::DeadlineExceeded);
        assert!(!retryable(&timed_out));
        // A cancel from anywhere else stays one (and is retried).
        let other = deadline_as_such(Status::cancelled("client went away"));
        assert_eq!(other.code(), Code::Cancelled);
        assert!(retryable(&other));
    }

    #[test]
    fn failures_map_to_statuses() {
        let e = client_error(&Status::unavailable("x"), 1);
        assert_eq!(
            (e.status(), e.message().as_str()),
            (502, "A worker failed (UNAVAILABLE).")
        );
        assert_eq!(
            client_error(&Status::resource_exhausted("x"), 3).status(),
            429
        );
        assert_eq!(
            client_error(&Status::deadline_exceeded("x"), 1).status(),
            504
        );
        assert_eq!(
            client_error(&Status::invalid_argument("no"), 1).status(),
            400
        );
        assert!(retryable(&Status::cancelled("")) && !ejects(&Status::cancelled("")));
        assert!(ejects(&Status::internal("Received RST_STREAM")));
        let s = stopped_answering();
        assert!(retryable(&s) && ejects(&s));
    }
}
