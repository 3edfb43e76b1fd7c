//! The Python gateway's request metrics under the same names and labels, in Prometheus text:
//! embedfleet_gateway_requests_total{route,code}, embedfleet_gateway_request_seconds{route},
//! embedfleet_gateway_input_tokens_total, embedfleet_gateway_inflight_requests and, with
//! --api-key-metrics, embedfleet_gateway_key_requests_total{key,route}. Hand-written: five
//! families do not need a client library's registry, locks and label hashing per request.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// The Python gateway's request-duration buckets (metrics.py _LATENCY).
pub const LATENCY: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; LATENCY.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
struct Requests {
    counts: BTreeMap<(&'static str, u16), u64>,
    seconds: BTreeMap<&'static str, Histogram>,
}

#[derive(Default)]
pub struct Metrics {
    requests: Mutex<Requests>,
    keys: Mutex<BTreeMap<(Arc<str>, &'static str), u64>>,
    pub input_tokens: AtomicU64,
    pub inflight: AtomicI64,
}

/// Python's float repr for the values these families hold (prometheus_client writes floats).
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e16 {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

impl Metrics {
    pub fn observe(&self, route: &'static str, code: u16, seconds: f64) {
        let mut r = self.requests.lock().expect("metrics lock");
        *r.counts.entry((route, code)).or_default() += 1;
        let h = r.seconds.entry(route).or_default();
        // Buckets are cumulative at exposition; here each sample lands in its first bucket.
        if let Some(i) = LATENCY.iter().position(|&b| seconds <= b) {
            h.counts[i] += 1;
        }
        h.count += 1;
        h.sum += seconds;
    }

    /// One authorized request of the key whose label this is.
    pub fn count_key(&self, label: Arc<str>, route: &'static str) {
        *self
            .keys
            .lock()
            .expect("metrics lock")
            .entry((label, route))
            .or_default() += 1;
    }

    pub fn exposition(&self) -> String {
        let keys = self.keys.lock().expect("metrics lock").clone();
        let (counts, seconds) = {
            let r = self.requests.lock().expect("metrics lock");
            (r.counts.clone(), r.seconds.clone())
        };
        let mut out = String::with_capacity(4096);
        out.push_str(
            "# HELP embedfleet_gateway_requests_total HTTP requests by route and status code.\n",
        );
        out.push_str("# TYPE embedfleet_gateway_requests_total counter\n");
        for ((route, code), n) in &counts {
            let _ = writeln!(
                out,
                "embedfleet_gateway_requests_total{{route=\"{route}\",code=\"{code}\"}} {}",
                number(*n as f64)
            );
        }
        out.push_str("# HELP embedfleet_gateway_request_seconds Time from request start to the response being sent, by route.\n");
        out.push_str("# TYPE embedfleet_gateway_request_seconds histogram\n");
        for (route, h) in &seconds {
            let mut cumulative = 0;
            for (i, bound) in LATENCY.iter().enumerate() {
                cumulative += h.counts[i];
                let _ = writeln!(
                    out,
                    "embedfleet_gateway_request_seconds_bucket{{le=\"{}\",route=\"{route}\"}} {}",
                    number(*bound),
                    number(cumulative as f64)
                );
            }
            let _ = writeln!(
                out,
                "embedfleet_gateway_request_seconds_bucket{{le=\"+Inf\",route=\"{route}\"}} {}",
                number(h.count as f64)
            );
            let _ = writeln!(
                out,
                "embedfleet_gateway_request_seconds_count{{route=\"{route}\"}} {}",
                number(h.count as f64)
            );
            let _ = writeln!(
                out,
                "embedfleet_gateway_request_seconds_sum{{route=\"{route}\"}} {}",
                h.sum
            );
        }
        out.push_str(
            "# HELP embedfleet_gateway_key_requests_total Authorized requests per API key (only \
             with --api-key-metrics), by route; `key` is the first 12 hex digits of the key's \
             sha256, never the key.\n",
        );
        out.push_str("# TYPE embedfleet_gateway_key_requests_total counter\n");
        for ((key, route), n) in &keys {
            let _ = writeln!(
                out,
                "embedfleet_gateway_key_requests_total{{key=\"{key}\",route=\"{route}\"}} {}",
                number(*n as f64)
            );
        }
        out.push_str("# HELP embedfleet_gateway_input_tokens_total Tokens of accepted requests.\n");
        out.push_str("# TYPE embedfleet_gateway_input_tokens_total counter\n");
        let _ = writeln!(
            out,
            "embedfleet_gateway_input_tokens_total {}",
            number(self.input_tokens.load(Ordering::Relaxed) as f64)
        );
        out.push_str("# HELP embedfleet_gateway_inflight_requests Requests being served now.\n");
        out.push_str("# TYPE embedfleet_gateway_inflight_requests gauge\n");
        let _ = writeln!(
            out,
            "embedfleet_gateway_inflight_requests {}",
            number(self.inflight.load(Ordering::Relaxed) as f64)
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let m = Metrics::default();
        m.observe("/v1/embeddings", 200, 0.002);
        m.observe("/v1/embeddings", 200, 0.2);
        m.observe("/v1/embeddings", 400, 100.0);
        let text = m.exposition();
        assert!(text.contains(
            "embedfleet_gateway_requests_total{route=\"/v1/embeddings\",code=\"200\"} 2.0"
        ));
        assert!(text.contains("_bucket{le=\"0.0025\",route=\"/v1/embeddings\"} 1.0"));
        assert!(text.contains("_bucket{le=\"0.25\",route=\"/v1/embeddings\"} 2.0"));
        assert!(text.contains("_bucket{le=\"30.0\",route=\"/v1/embeddings\"} 2.0"));
        assert!(text.contains("_bucket{le=\"+Inf\",route=\"/v1/embeddings\"} 3.0"));
    }

    #[test]
    fn key_requests_are_counted_by_label_and_route() {
        let m = Metrics::default();
        let label: Arc<str> = Arc::from("ba7816bf8f01");
        m.count_key(Arc::clone(&label), "/v1/embeddings");
        m.count_key(label, "/v1/embeddings");
        let text = m.exposition();
        assert!(text.contains(
            "embedfleet_gateway_key_requests_total{key=\"ba7816bf8f01\",route=\"/v1/embeddings\"} 2.0"
        ));
    }
}
