//! The bytes of request messages the worker holds at once and the calls in flight (as
//! worker/src/embedfleet/worker/inflight.py): a message that would take the bytes past
//! --max-inflight-bytes is refused RESOURCE_EXHAUSTED before it is parsed; the drain waits for
//! the in-flight count to reach zero.
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
pub struct Limits {
    bytes: AtomicUsize,
    max_bytes: usize,
    inflight: AtomicUsize,
    draining: AtomicBool,
}

/// One admitted message's bytes and its place in the in-flight count, given back on drop.
#[derive(Debug)]
pub struct Held {
    limits: Arc<Limits>,
    size: usize,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.limits.bytes.fetch_sub(self.size, Ordering::AcqRel);
        self.limits.inflight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Limits {
    pub fn new(max_bytes: usize) -> Arc<Self> {
        Arc::new(Limits {
            bytes: AtomicUsize::new(0),
            max_bytes,
            inflight: AtomicUsize::new(0),
            draining: AtomicBool::new(false),
        })
    }

    /// A hold on `size` more bytes, or the refusal's message when they would pass the limit.
    pub fn take(self: &Arc<Self>, size: usize) -> Result<Held, String> {
        let taken = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + size <= self.max_bytes).then_some(held + size)
            });
        match taken {
            Ok(_) => {
                self.inflight.fetch_add(1, Ordering::AcqRel);
                Ok(Held {
                    limits: Arc::clone(self),
                    size,
                })
            }
            // Word for word the Python front's (inflight.py, ByteBudget.refusal).
            Err(held) => Err(format!(
                "the worker holds {} of request messages; this {} one would pass its limit of \
                 {} (--max-inflight-bytes): retry later or elsewhere",
                mib(held),
                mib(size),
                mib(self.max_bytes)
            )),
        }
    }

    /// Request message bytes held now.
    pub fn held(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    pub fn inflight(&self) -> usize {
        self.inflight.load(Ordering::Acquire)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Release);
    }
}

fn mib(size: usize) -> String {
    format!("{:.1} MiB", size as f64 / f64::from(1u32 << 20))
}
