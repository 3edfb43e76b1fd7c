//! Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, with a status:
//! the same statuses, types, params and codes as the Python gateway's errors.py.

/// An error the client should see; everything else is a 500 with no detail.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    pub headers: Vec<(&'static str, String)>,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
            headers: Vec::new(),
        }
    }

    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn kind(mut self, kind: &'static str) -> Self {
        self.kind = kind;
        self
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }

    /// The JSON body, keys in the Python gateway's order.
    pub fn body(&self) -> Vec<u8> {
        let quoted = |v: Option<&str>| v.map_or("null".to_string(), json_string);
        format!(
            r#"{{"error":{{"message":{},"type":{},"param":{},"code":{}}}}}"#,
            json_string(&self.message),
            json_string(self.kind),
            quoted(self.param),
            quoted(self.code),
        )
        .into_bytes()
    }
}

/// Python's `format(x, "g")`: six significant digits, trailing zeros dropped, scientific below
/// 1e-4 and from 1e6 on (30 -> "30", 0.5 -> "0.5", 1234567 -> "1.23457e+06").
pub fn python_g(x: f64) -> String {
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

pub fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::new(400, message)
}

pub fn too_large(message: impl Into<String>) -> ApiError {
    ApiError::new(413, message).code("request_too_large")
}

pub fn not_found(message: impl Into<String>) -> ApiError {
    ApiError::new(404, message)
}

pub fn not_allowed(message: impl Into<String>, allow: &'static str) -> ApiError {
    ApiError::new(405, message)
        .code("method_not_allowed")
        .header("allow", allow)
}

pub fn overloaded(retry_after: u64, message: &str) -> ApiError {
    ApiError::new(429, message)
        .kind("rate_limit_error")
        .code("overloaded")
        .header("retry-after", retry_after.to_string())
}

pub fn unavailable(message: &str) -> ApiError {
    ApiError::new(503, message)
        .kind("server_error")
        .code("no_workers")
}

/// OpenAI's answer to a missing or wrong key (the key itself is never echoed).
pub fn unauthorized(presented: bool) -> ApiError {
    let message = if presented {
        "Incorrect API key provided."
    } else {
        "You didn't provide an API key. Pass it as 'Authorization: Bearer <key>'."
    };
    ApiError::new(401, message)
        .code("invalid_api_key")
        .header("www-authenticate", "Bearer")
}

pub fn internal() -> ApiError {
    ApiError::new(500, "Internal server error.")
        .kind("server_error")
        .code("internal_error")
}

/// What this binary does not do yet: never a silently different answer.
pub fn unsupported(what: &str) -> ApiError {
    ApiError::new(
        501,
        format!(
            "{what} is not supported by embedfleet-gateway-rs; the Python gateway \
             (embedfleet-gateway) serves it."
        ),
    )
    .kind("server_error")
    .code("not_implemented")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_has_openai_shape_in_order() {
        let e = invalid("bad \"x\"").param("input");
        assert_eq!(
            String::from_utf8(e.body()).unwrap(),
            r#"{"error":{"message":"bad \"x\"","type":"invalid_request_error","param":"input","code":null}}"#
        );
    }

    #[test]
    fn bounds_print_as_python_formats_them() {
        assert_eq!(python_g(30.0), "30");
        assert_eq!(python_g(0.5), "0.5");
        assert_eq!(python_g(2.25), "2.25");
        assert_eq!(python_g(3600.0), "3600");
        assert_eq!(python_g(0.123456789), "0.123457");
        assert_eq!(python_g(1234567.0), "1.23457e+06");
        assert_eq!(python_g(0.00001), "1e-05");
    }
}
