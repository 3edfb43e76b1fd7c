//! One line per interval, for a line a client or an outage can cause at any rate (as
//! common/logs.py's LogLimiter).
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One line per `every` and a count of those held back in between.
pub struct Limiter {
    every: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl Limiter {
    pub const fn new(every: Duration) -> Self {
        Limiter {
            every,
            state: Mutex::new((None, 0)),
        }
    }

    /// The count held back since the last line let through, or None to stay quiet.
    pub fn allow(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().expect("limiter lock");
        let (next, held) = &mut *state;
        if next.is_some_and(|at| now < at) {
            *held += 1;
            return None;
        }
        *next = Some(now + self.every);
        Some(std::mem::take(held))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_lets_one_through_per_interval_and_counts_the_rest() {
        let limiter = Limiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limiter.allow(t0), Some(0));
        assert_eq!(limiter.allow(t0 + Duration::from_secs(1)), None);
        assert_eq!(limiter.allow(t0 + Duration::from_secs(9)), None);
        assert_eq!(limiter.allow(t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(limiter.allow(t0 + Duration::from_secs(11)), None);
    }
}
