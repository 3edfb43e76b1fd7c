//! Holding requests while no worker is ready: how a fleet scaled to zero wakes up. With
//! `--hold-requests` > 0 a request arriving while no worker is ready waits, bounded in count and by
//! `--hold-seconds`, instead of failing at once; the waiting requests and their tokens are the
//! gauges the operator's autoscaler reads as demand. Past either bound the answer is 503 with
//! Retry-After. /ready stays OK meanwhile (`keeps_ready`), so the gateway stays in its Service and
//! the first requests reach it at all.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::api::errors::{short_number, ApiError};
use crate::telemetry::metrics::ModelMetrics;
use crate::upstream::pool::Pool;

pub struct Hold {
    pool: Arc<Pool>,
    metrics: Arc<ModelMetrics>,
    max_requests: usize,
    seconds: f64,
    retry_after: u64,
    /// requests waiting now, and their tokens
    pub held: AtomicUsize,
    pub held_tokens: AtomicU64,
}

/// A held request's place, given back however the wait ends (a worker, a refusal, the client
/// going away and the request's future being dropped).
struct Place<'a> {
    hold: &'a Hold,
    tokens: u64,
    start: Instant,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.hold.held.fetch_sub(1, Ordering::Relaxed);
        self.hold
            .held_tokens
            .fetch_sub(self.tokens, Ordering::Relaxed);
        self.hold
            .metrics
            .hold
            .observe(self.start.elapsed().as_secs_f64());
    }
}

impl Hold {
    pub fn new(
        pool: Arc<Pool>,
        metrics: Arc<ModelMetrics>,
        max_requests: usize,
        seconds: f64,
        retry_after: u64,
    ) -> Self {
        Hold {
            pool,
            metrics,
            max_requests,
            seconds,
            retry_after,
            held: AtomicUsize::new(0),
            held_tokens: AtomicU64::new(0),
        }
    }

    /// Holding is on: no ready worker is a state to wait out, not a reason to leave the Service.
    pub fn keeps_ready(&self) -> bool {
        self.max_requests > 0
    }

    /// A request arriving now would be held (rather than refused for want of a worker).
    pub fn will_hold(&self) -> bool {
        self.keeps_ready() && !self.pool.ready()
    }

    /// At once while a worker is ready (or holding is off); else waits for one, counted in the
    /// held gauges, or 503 with Retry-After past the bounds.
    pub async fn until_ready(&self, tokens: usize) -> Result<(), ApiError> {
        if !self.will_hold() {
            return Ok(());
        }
        let held = self.held.load(Ordering::Relaxed);
        if held >= self.max_requests {
            self.metrics.hold_full.inc();
            return Err(ApiError::HoldFull {
                held,
                retry_after: self.retry_after,
            });
        }
        self.held.fetch_add(1, Ordering::Relaxed);
        self.held_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
        let _place = Place {
            hold: self,
            tokens: tokens as u64,
            start: Instant::now(),
        };
        let bound = Duration::from_secs_f64(self.seconds);
        if tokio::time::timeout(bound, self.pool.wait_ready())
            .await
            .is_err()
        {
            self.metrics.hold_timeout.inc();
            return Err(ApiError::HoldTimeout {
                seconds: short_number(self.seconds),
                retry_after: self.retry_after,
            });
        }
        Ok(())
    }
}
