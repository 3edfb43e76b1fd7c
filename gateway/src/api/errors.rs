//! The error catalog: every refusal the gateway answers, with its HTTP status, OpenAI error
//! `type`, `code`, `param` and message template, declared once here. A refusal is sent as
//! `{"error": {"message", "type", "param", "code"}}` (`ApiError::body`) with the headers it
//! calls for (`ApiError::headers`); contract/errors.md is generated from [`CATALOG`].

use std::fmt::Write;

/// One row of the catalog, as contract/errors.md shows it.
pub struct Row {
    pub name: &'static str,
    pub status: u16,
    pub kind: &'static str,
    pub code: Option<&'static str>,
    /// the `param`: a field's name, or the name of the value that gives it
    pub param: &'static str,
    pub template: &'static str,
}

/// Declares [`ApiError`] (one variant per refusal), what each one says, and [`CATALOG`].
macro_rules! catalog {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident { $($field:ident : $ty:ty),* $(,)? }
            = $status:literal, $kind:literal, $code:expr, $param:expr, $template:literal;
    )*) => {
        /// A refusal: what the client is told, and with which status.
        #[derive(Debug, Clone, PartialEq)]
        pub enum ApiError {
            $($(#[doc = $doc])* $name { $($field: $ty),* },)*
        }

        impl ApiError {
            fn row(&self) -> &'static Row {
                match self {
                    $(ApiError::$name { .. } => &CATALOG[Index::$name as usize],)*
                }
            }

            /// The message, the template with this refusal's values.
            pub fn message(&self) -> String {
                match self {
                    $(#[allow(unused_variables)] ApiError::$name { $($field),* } => format!($template),)*
                }
            }

            /// The request field the refusal is about, if any.
            pub fn param(&self) -> Option<&'static str> {
                match self {
                    $(#[allow(unused_variables)] ApiError::$name { $($field),* } => $param,)*
                }
            }
        }

        #[allow(non_camel_case_types, clippy::enum_variant_names)]
        enum Index { $($name,)* }

        /// Every refusal, in declaration order.
        pub const CATALOG: &[Row] = &[$(Row {
            name: stringify!($name),
            status: $status,
            kind: $kind,
            code: $code,
            param: stringify!($param),
            template: $template,
        },)*];
    };
}

catalog! {
    // --- the connection (http::connection) ---
    /// The request line or a header could not be parsed.
    MalformedRequest {} = 400, "invalid_request_error", None, None,
        "The request is not valid HTTP/1.1.";
    /// The request line and headers are over --max-header-bytes, or more than --max-headers.
    HeadersTooLarge { bytes: usize, count: usize } = 431, "invalid_request_error",
        Some("request_header_fields_too_large"), None,
        "The request's headers are over the limit of {bytes} bytes or {count} fields.";
    /// The request target is longer than HTTP/1.1's parser takes.
    UriTooLong {} = 414, "invalid_request_error", Some("uri_too_long"), None,
        "The request target is too long.";
    /// The request line and headers did not arrive within --header-timeout-seconds.
    HeadersTimeout {} = 408, "invalid_request_error", Some("request_timeout"), None,
        "The request's headers did not arrive in time.";
    /// Past --max-connections: answered before any work, then closed.
    TooManyConnections {} = 503, "server_error", Some("too_many_connections"), None,
        "The server holds its maximum number of connections; retry later.";

    // --- the route, the key and the body (http::routes) ---
    NoRoute { path: String } = 404, "invalid_request_error", Some("not_found"), None,
        "No route {path}.";
    MethodNotAllowed { route: &'static str, method: &'static str, allow: &'static str } = 405,
        "invalid_request_error", Some("method_not_allowed"), None, "Use {method} for {route}.";
    KeyMissing {} = 401, "invalid_request_error", Some("invalid_api_key"), None,
        "You didn't provide an API key. Pass it as 'Authorization: Bearer <key>'.";
    /// The key itself is never echoed.
    KeyWrong {} = 401, "invalid_request_error", Some("invalid_api_key"), None,
        "Incorrect API key provided.";
    BodyTooLarge { limit: usize } = 413, "invalid_request_error", Some("request_too_large"),
        None, "The request body is over the limit of {limit} bytes.";
    NotJson {} = 415, "invalid_request_error", Some("unsupported_media_type"), None,
        "The request body must be JSON (Content-Type: application/json).";
    BodyTimeout {} = 408, "invalid_request_error", Some("request_timeout"), None,
        "The request body did not arrive in time.";
    /// A chunked body that breaks its framing, or a body that ends before its Content-Length.
    MalformedBody { reason: &'static str } = 400, "invalid_request_error", None, None,
        "The request body is malformed: {reason}.";

    // --- the body's document (api::request) ---
    BodyNotJson { detail: String } = 400, "invalid_request_error", None, None,
        "The request body is not valid JSON: {detail}.";
    BodyNotObject {} = 400, "invalid_request_error", None, None,
        "The request body must be a JSON object.";
    Required { param: &'static str } = 400, "invalid_request_error", None, Some(*param),
        "'{param}' is required.";
    /// A field of the wrong type or out of range (`at` names it, `param` too).
    Field { param: &'static str, at: &'static str, detail: &'static str } = 400,
        "invalid_request_error", None, Some(*param), "'{at}': {detail}.";
    InputShape {} = 400, "invalid_request_error", None, Some("input"),
        "'input' must be a non-empty string, an array of strings, an array of token ids \
         (integers) or an array of arrays of token ids.";
    TextsShape { param: &'static str } = 400, "invalid_request_error", None, Some(*param),
        "'{param}' must be a string or an array of strings.";
    QueryNotString {} = 400, "invalid_request_error", None, Some("query"),
        "'query' must be a string.";
    DocumentsShape {} = 400, "invalid_request_error", None, Some("documents"),
        "'documents' must be an array of strings or of {{\"text\": string}} objects.";

    // --- the served model (model::catalog, app::service) ---
    ModelRequired { served: String } = 400, "invalid_request_error", None, Some("model"),
        "'model' is required: this server serves {served}.";
    ModelNotFound { requested: String, serves: String } = 404, "invalid_request_error",
        Some("model_not_found"), Some("model"), "The model '{requested}' does not exist; {serves}.";
    /// The model's task is not the route's (`serves`: the routes that fit it).
    WrongTask { model: &'static str, is: &'static str, route: &'static str,
        needs: &'static str, serves: &'static str } = 400, "invalid_request_error", None,
        Some("model"), "'{model}' is {is}; {route} needs {needs}. Use {serves}.";
    InstructionNotTaken { model: &'static str } = 400, "invalid_request_error", None,
        Some("instruction"),
        "'instruction' applies only to prompt-template rerankers (Qwen3-Reranker); '{model}' \
         takes none.";

    // --- the request's values (app::service, plan::tokenize) ---
    Empty { param: &'static str } = 400, "invalid_request_error", None, Some(*param),
        "'{param}' must not be empty.";
    EmptyItem { param: &'static str, index: usize } = 400, "invalid_request_error", None,
        Some(*param), "'{param}' item {index} is an empty string.";
    EmptyPairText {} = 400, "invalid_request_error", None, Some("text_1"),
        "Texts to score must not be empty.";
    LengthsDiffer { first: usize, second: usize } = 400, "invalid_request_error", None,
        Some("text_2"),
        "text_1 and text_2 are lists of different lengths ({first} and {second}); pass equal \
         lengths, or a single text on one side.";
    TooManyItems { param: &'static str, count: usize, most: usize } = 413,
        "invalid_request_error", Some("request_too_large"), Some(*param),
        "'{param}' holds {count} items; at most {most} are allowed per request. Split the \
         request.";
    TooManyTokens { param: &'static str, total: usize, most: usize } = 413,
        "invalid_request_error", Some("request_too_large"), Some(*param),
        "The request holds {total} tokens; at most {most} are allowed per request. Split the \
         request.";
    DimensionsOutOfRange { most: usize, got: i64 } = 400, "invalid_request_error", None,
        Some("dimensions"), "'dimensions' must be between 1 and {most} for this model; got {got}.";
    TruncateAndSplit {} = 400, "invalid_request_error", None, Some("split_long_inputs"),
        "'truncate' and 'split_long_inputs' are both true: pick one way to handle inputs over \
         the model's limit.";
    CannotSplit { detail: String } = 400, "invalid_request_error", None,
        Some("split_long_inputs"), "Cannot split inputs: {detail}.";
    /// `count` is "N" or "at least N"; `split` offers windows where the param is `input`.
    TooLong { param: &'static str, index: usize, count: String, limit: usize,
        split: &'static str } = 400, "invalid_request_error", Some("context_length_exceeded"),
        Some(*param),
        "Input {index} has {count} tokens, more than this model's limit of {limit}. Shorten it, \
         pass \"truncate\": true to cut it{split}.";
    EmptyIds { index: usize } = 400, "invalid_request_error", None, Some("input"),
        "Input {index} is an empty list of token ids.";
    IdOutsideVocabulary { index: usize, vocab: usize } = 400, "invalid_request_error", None,
        Some("input"), "Input {index} holds a token id outside this model's vocabulary [0, {vocab}).";
    NoCalibration { encoding: &'static str, precision: &'static str, dimensions: usize,
        held: String } = 400, "invalid_request_error", None, Some("encoding_format"),
        "'{encoding}' needs this model's {precision} calibration at {dimensions} dimensions, and \
         the server has {held}. Use binary or float, or calibrate (embedfleet calibrate; \
         docs/gateway.md).";

    // --- the gateway's capacity (plan::admission, plan::hold) ---
    /// More work queued ahead than --max-queue-seconds (`queued`, `bound`: seconds).
    Shed { queued: String, bound: String, retry_after: u64 } = 429, "rate_limit_error",
        Some("overloaded"), None,
        "The workers have {queued}s of work queued, more than this gateway's bound of \
         {bound}s; retry later.";
    HoldFull { held: usize, retry_after: u64 } = 503, "server_error", Some("no_workers"), None,
        "No worker is ready yet (the fleet is starting); {held} requests are already waiting \
         for it. Retry later.";
    HoldTimeout { seconds: String, retry_after: u64 } = 503, "server_error",
        Some("no_workers"), None,
        "No worker is ready yet (the fleet is starting); none became ready within {seconds} s. \
         Retry later.";
    NoReadyWorker {} = 503, "server_error", Some("no_workers"), None, "No ready worker.";
    NoWorkerLeft {} = 503, "server_error", Some("no_workers"), None,
        "No ready worker left to take the request.";

    // --- the workers' answers (upstream::failure) ---
    WorkerRejected { detail: String } = 400, "invalid_request_error", None, None,
        "The worker rejected the input: {detail}";
    WorkerBusy { retry_after: u64 } = 429, "rate_limit_error", Some("overloaded"), None,
        "A worker's queue is full; retry later.";
    WorkerTimeout {} = 504, "server_error", Some("upstream_timeout"), None,
        "A worker did not answer in time.";
    /// `code`: the gRPC status's name.
    WorkerFailed { code: &'static str } = 502, "server_error", Some("upstream_error"), None,
        "A worker failed ({code}).";
    /// Anything else: no detail is given (the log says what).
    Internal {} = 500, "server_error", Some("internal_error"), None, "Internal server error.";
}

impl ApiError {
    pub fn status(&self) -> u16 {
        self.row().status
    }

    pub fn code(&self) -> Option<&'static str> {
        self.row().code
    }

    /// The headers this refusal is sent with.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        match self {
            ApiError::Shed { retry_after, .. }
            | ApiError::HoldFull { retry_after, .. }
            | ApiError::HoldTimeout { retry_after, .. }
            | ApiError::WorkerBusy { retry_after } => {
                vec![("retry-after", retry_after.to_string())]
            }
            ApiError::MethodNotAllowed { allow, .. } => vec![("allow", (*allow).to_string())],
            ApiError::KeyMissing {} | ApiError::KeyWrong {} => {
                vec![("www-authenticate", "Bearer".to_string())]
            }
            // The connection's framing is lost (or a client stalls): answered, then closed.
            ApiError::BodyTimeout {} | ApiError::MalformedBody { .. } => {
                vec![("connection", "close".to_string())]
            }
            _ => Vec::new(),
        }
    }

    /// The JSON body: `{"error": {"message", "type", "param", "code"}}`.
    pub fn body(&self) -> Vec<u8> {
        let row = self.row();
        let quoted = |v: Option<&str>| v.map_or("null".to_string(), json_string);
        format!(
            r#"{{"error":{{"message":{},"type":{},"param":{},"code":{}}}}}"#,
            json_string(&self.message()),
            json_string(row.kind),
            quoted(self.param()),
            quoted(row.code),
        )
        .into_bytes()
    }

    /// TEI's status and `error_type` for this refusal, by TEI's own mapping: a request it
    /// cannot take is "Validation" (413; 422 for a body of the wrong shape, as TEI's JSON
    /// extractor answers), an empty one "Empty" (400), then "Overloaded" (429), "Unhealthy"
    /// (503) and "Backend" (424). The connection's, the route's and the key's refusals keep
    /// their own status.
    pub fn tei(&self) -> (u16, &'static str) {
        use ApiError as E;
        match self {
            E::MalformedRequest {}
            | E::HeadersTooLarge { .. }
            | E::UriTooLong {}
            | E::HeadersTimeout {}
            | E::NoRoute { .. }
            | E::MethodNotAllowed { .. }
            | E::KeyMissing {}
            | E::KeyWrong {}
            | E::BodyTooLarge { .. }
            | E::NotJson {}
            | E::BodyTimeout {}
            | E::MalformedBody { .. }
            | E::BodyNotJson { .. }
            | E::ModelRequired { .. }
            | E::ModelNotFound { .. } => (self.status(), "Validation"),
            E::BodyNotObject {}
            | E::Required { .. }
            | E::Field { .. }
            | E::InputShape {}
            | E::TextsShape { .. }
            | E::QueryNotString {}
            | E::DocumentsShape {} => (422, "Validation"),
            E::Empty { .. } | E::EmptyItem { .. } | E::EmptyPairText {} => (400, "Empty"),
            _ => match self.status() {
                429 => (429, "Overloaded"),
                503 => (503, "Unhealthy"),
                502 | 504 => (424, "Backend"),
                500 => (500, "Backend"),
                _ => (413, "Validation"),
            },
        }
    }

    /// TEI's error body: `{"error", "error_type"}`.
    pub fn tei_body(&self) -> Vec<u8> {
        format!(
            r#"{{"error":{},"error_type":"{}"}}"#,
            json_string(&self.message()),
            self.tei().1
        )
        .into_bytes()
    }

    /// Cohere's error body: `{"id", "message"}`, the id a fresh random one.
    pub fn cohere_body(&self) -> Vec<u8> {
        format!(
            r#"{{"id":"{:032x}","message":{}}}"#,
            fastrand::u128(..),
            json_string(&self.message())
        )
        .into_bytes()
    }

    /// A whole HTTP/1.1 response that closes the connection, for refusals made below the
    /// router (the connection's own).
    pub fn close_response(&self) -> Vec<u8> {
        let body = self.body();
        let status = self.status();
        let reason = hyper::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        let mut out = format!(
            "HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: \
             {}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        out.extend_from_slice(&body);
        out
    }
}

/// A number as a short message writes it: six significant digits, no trailing zeros,
/// scientific below 1e-4 and from 1e6 on (30 -> "30", 0.5 -> "0.5", 1234567 -> "1.23457e+06").
pub fn short_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        return format!("{x}");
    }
    let sci = format!("{x:.5e}");
    let (mantissa, exponent) = sci.split_once('e').expect("an exponent");
    let exponent: i32 = exponent.parse().expect("an integer exponent");
    let trim = |t: &str| t.trim_end_matches('0').trim_end_matches('.').to_string();
    if !(-4..6).contains(&exponent) {
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{}e{sign}{:02}", trim(mantissa), exponent.abs());
    }
    trim(&format!("{x:.*}", (5 - exponent) as usize))
}

pub fn json_string(s: &str) -> String {
    serde_json::to_string(s).expect("a string always serializes")
}

/// The catalog as a markdown table (contract/errors.md).
pub fn markdown() -> String {
    let mut out = String::from(
        "# Error catalog\n\n\
         Generated from `gateway/src/api/errors.rs` (`cargo test` checks it is current; \
         `EMBEDFLEET_UPDATE_CONTRACT=1 cargo test` rewrites it). Every refusal is sent as \
         `{\"error\": {\"message\", \"type\", \"param\", \"code\"}}`; `{name}` in a message is \
         the refusal's value, and a `param` in plain words is the field the refusal names. On \
         TEI's routes the same message goes as `{\"error\", \"error_type\"}` with TEI's status \
         (`ApiError::tei`), on Cohere's as `{\"id\", \"message\"}` (docs/clients.md).\n\n\
         | name | status | type | code | param | message |\n|---|---|---|---|---|---|\n",
    );
    for row in CATALOG {
        let param = match row.param {
            "None" => "".to_string(),
            p => {
                let inner = p.trim_start_matches("Some(").trim_end_matches(')');
                match inner.strip_prefix('"') {
                    Some(fixed) => format!("`{}`", fixed.trim_end_matches('"')),
                    None => "the field".to_string(),
                }
            }
        };
        let template = row
            .template
            .replace("{{", "⟨")
            .replace("}}", "⟩")
            .replace('|', "\\|");
        let template = template.replace('⟨', "{").replace('⟩', "}");
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {param} | {template} |",
            row.name,
            row.status,
            row.kind,
            row.code.map_or(String::new(), |c| format!("`{c}`")),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape_in_order() {
        let e = ApiError::Field {
            param: "input",
            at: "input",
            detail: "bad \"x\"",
        };
        assert_eq!(
            String::from_utf8(e.body()).unwrap(),
            r#"{"error":{"message":"'input': bad \"x\".","type":"invalid_request_error","param":"input","code":null}}"#
        );
    }

    #[test]
    fn each_refusal_finds_its_own_row() {
        let e = ApiError::WorkerBusy { retry_after: 3 };
        assert_eq!((e.status(), e.code()), (429, Some("overloaded")));
        assert_eq!(e.headers(), vec![("retry-after", "3".to_string())]);
        assert_eq!(ApiError::Internal {}.status(), 500);
        let names: std::collections::HashSet<_> = CATALOG.iter().map(|r| r.name).collect();
        assert_eq!(names.len(), CATALOG.len());
    }

    #[test]
    fn tei_and_cohere_shapes_and_statuses() {
        let cases = [
            (ApiError::Required { param: "inputs" }, 422, "Validation"),
            (
                ApiError::EmptyItem {
                    param: "inputs",
                    index: 0,
                },
                400,
                "Empty",
            ),
            (
                ApiError::DimensionsOutOfRange { most: 4, got: 9 },
                413,
                "Validation",
            ),
            (ApiError::WorkerBusy { retry_after: 1 }, 429, "Overloaded"),
            (ApiError::NoReadyWorker {}, 503, "Unhealthy"),
            (ApiError::WorkerTimeout {}, 424, "Backend"),
            (ApiError::KeyMissing {}, 401, "Validation"),
        ];
        for (e, status, kind) in cases {
            assert_eq!(e.tei(), (status, kind), "{e:?}");
            let doc: serde_json::Value = serde_json::from_slice(&e.tei_body()).unwrap();
            assert_eq!(doc["error"], e.message());
            assert_eq!(doc["error_type"], kind);
            let doc: serde_json::Value = serde_json::from_slice(&e.cohere_body()).unwrap();
            assert_eq!(doc["message"], e.message());
            assert_eq!(doc["id"].as_str().unwrap().len(), 32);
        }
    }

    #[test]
    fn a_close_response_is_complete() {
        let text = String::from_utf8(ApiError::HeadersTimeout {}.close_response()).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 408 Request Timeout\r\n"));
        assert!(head.contains("connection: close"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let doc: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(doc["error"]["code"], "request_timeout");
    }

    #[test]
    fn numbers_print_short() {
        assert_eq!(short_number(30.0), "30");
        assert_eq!(short_number(0.5), "0.5");
        assert_eq!(short_number(2.25), "2.25");
        assert_eq!(short_number(3600.0), "3600");
        assert_eq!(short_number(0.123456789), "0.123457");
        assert_eq!(short_number(1234567.0), "1.23457e+06");
        assert_eq!(short_number(0.00001), "1e-05");
    }
}
