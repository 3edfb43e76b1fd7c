//! The worker's speed as its own traffic shows it (as worker/src/embedfleet/worker/
//! throughput.py, whose module doc says why): tokens over seconds of the latest batches cut by
//! the budget while more work waited, each timed from the previous batch's end to its own, so a
//! trickle of small batches never passes for the worker's capacity. Info and /metrics report it
//! as saturated_tokens_per_second; the gateway queues by it once it is non-zero.
use std::collections::VecDeque;
use std::time::Instant;

/// Busy seconds the figure averages over (throughput.py's WINDOW_SECONDS).
pub const WINDOW_SECONDS: f64 = 10.0;
/// Busy seconds seen before there is a figure at all (throughput.py's MIN_SECONDS).
pub const MIN_SECONDS: f64 = 2.0;

/// Tokens over seconds of the latest saturated batches, `window` busy seconds of them.
pub struct BusyThroughput {
    window: f64,
    least: f64,
    samples: VecDeque<(u64, f64)>,
    tokens: u64,
    seconds: f64,
}

impl BusyThroughput {
    pub fn new(window: f64, least: f64) -> Self {
        assert!(0.0 < least && least <= window, "need 0 < least <= window");
        BusyThroughput {
            window,
            least,
            samples: VecDeque::new(),
            tokens: 0,
            seconds: 0.0,
        }
    }

    /// One saturated batch: `tokens` computed in `seconds` since the previous one finished.
    pub fn add(&mut self, tokens: u64, seconds: f64) {
        if tokens == 0 || seconds <= 0.0 {
            return;
        }
        self.samples.push_back((tokens, seconds));
        self.tokens += tokens;
        self.seconds += seconds;
        while self.samples.len() > 1 {
            let (old_tokens, old_seconds) = self.samples[0];
            if self.seconds - old_seconds < self.window {
                break;
            }
            self.samples.pop_front();
            self.tokens -= old_tokens;
            self.seconds -= old_seconds;
        }
    }

    /// Tokens/s over the window; 0 until `least` busy seconds have been seen.
    pub fn rate(&self) -> f64 {
        if self.seconds < self.least {
            return 0.0;
        }
        self.tokens as f64 / self.seconds
    }
}

/// The engine thread's clock of batch ends: what each batch is timed against.
pub struct BatchClock {
    throughput: BusyThroughput,
    last_done: Option<Instant>,
}

impl BatchClock {
    pub fn new(throughput: BusyThroughput) -> Self {
        BatchClock {
            throughput,
            last_done: None,
        }
    }

    /// The engine waited for work: the next batch's time since the last one is not compute.
    pub fn idled(&mut self) {
        self.last_done = None;
    }

    /// A batch of `tokens` computed ended at `done`; `saturated` when the budget cut it while
    /// more work waited. The new figure when this batch moved it above 0, else None. A batch
    /// that computed nothing (`tokens` 0: the engine failed) still ends the previous one's time.
    pub fn finished(&mut self, tokens: u64, saturated: bool, done: Instant) -> Option<f64> {
        let last = self.last_done.replace(done);
        let since = last.map(|last| done.saturating_duration_since(last))?;
        if !saturated {
            return None;
        }
        self.throughput.add(tokens, since.as_secs_f64());
        let rate = self.throughput.rate();
        (rate > 0.0).then_some(rate)
    }
}

impl Default for BatchClock {
    fn default() -> Self {
        BatchClock::new(BusyThroughput::new(WINDOW_SECONDS, MIN_SECONDS))
    }
}
