//! Choosing a worker: least outstanding tokens between two random candidates, with ejection
//! (the Python gateway's balancer.py).

use std::time::Instant;

#[derive(Debug, Clone)]
pub struct Endpoint {
    pub address: String,
    /// tokens this gateway has sent and not yet had answered
    pub outstanding_tokens: usize,
    /// the worker's last Info said ready (and not draining)
    pub ready: bool,
    pub ejected_until: Option<Instant>,
    /// tokens/s the worker sustains saturated, else its warm-up figure (0: neither reported)
    pub capacity: f64,
    /// tokens other gateways queued there: its reported queue beyond this gateway's share
    pub queued_elsewhere: usize,
}

impl Endpoint {
    pub fn new(address: &str) -> Self {
        Endpoint {
            address: address.to_string(),
            outstanding_tokens: 0,
            ready: false,
            ejected_until: None,
            capacity: 0.0,
            queued_elsewhere: 0,
        }
    }

    pub fn usable(&self, now: Instant) -> bool {
        self.ready && self.ejected_until.is_none_or(|t| t <= now)
    }
}

/// Index of the less loaded of two distinct random candidates (the only one if just one).
pub fn choose(loads: &[usize], random: u64) -> usize {
    let n = loads.len() as u64;
    if n == 1 {
        return 0;
    }
    let a = (random % n) as usize;
    let b = ((a as u64 + 1 + (random >> 32) % (n - 1)) % n) as usize;
    if loads[a] <= loads[b] {
        a
    } else {
        b
    }
}

/// A small xorshift: two random candidates need no cryptographic randomness nor a crate.
pub struct Rng(u64);

impl Rng {
    pub fn seeded() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Rng(nanos | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// Uniform in [0, 1): the top 53 bits of the next draw.
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

pub struct Balancer {
    pub endpoints: Vec<Endpoint>,
    pub eject_seconds: f64,
    rng: Rng,
}

impl Balancer {
    pub fn new(addresses: &[String], eject_seconds: f64) -> Self {
        let mut sorted = addresses.to_vec();
        sorted.sort();
        sorted.dedup();
        Balancer {
            endpoints: sorted.iter().map(|a| Endpoint::new(a)).collect(),
            eject_seconds,
            rng: Rng::seeded(),
        }
    }

    pub fn usable(&self, now: Instant) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.iter().filter(move |e| e.usable(now))
    }

    /// The endpoint index to call, not in `exclude`; ejected ones only when nothing else is
    /// left (ejection is advice: trying an ejected worker beats failing).
    pub fn pick(&mut self, exclude: &[usize], now: Instant) -> Option<usize> {
        let mut candidates: Vec<usize> = (0..self.endpoints.len())
            .filter(|i| !exclude.contains(i) && self.endpoints[*i].usable(now))
            .collect();
        if candidates.is_empty() {
            candidates = (0..self.endpoints.len())
                .filter(|i| !exclude.contains(i) && self.endpoints[*i].ready)
                .collect();
        }
        if candidates.is_empty() {
            return None;
        }
        let loads: Vec<usize> = candidates
            .iter()
            .map(|&i| self.endpoints[i].outstanding_tokens)
            .collect();
        let random = self.rng.next();
        Some(candidates[choose(&loads, random)])
    }

    /// True if this ejected a worker that was not already ejected.
    pub fn eject(&mut self, index: usize, now: Instant) -> bool {
        let e = &mut self.endpoints[index];
        let fresh = e.ejected_until.is_none_or(|t| t <= now);
        e.ejected_until = Some(now + std::time::Duration::from_secs_f64(self.eject_seconds));
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choose_takes_the_less_loaded_of_two_distinct() {
        for r in 0..1000u64 {
            let random = r.wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let i = choose(&[5, 0], random);
            assert_eq!(i, 1);
            assert!(choose(&[1, 2, 3], random) < 2);
        }
        assert_eq!(choose(&[7], 12345), 0);
    }

    #[test]
    fn pick_skips_unready_and_ejected_then_falls_back() {
        let now = Instant::now();
        let mut b = Balancer::new(&["b:1".into(), "a:1".into()], 5.0);
        assert_eq!(b.pick(&[], now), None);
        b.endpoints[0].ready = true;
        b.endpoints[1].ready = true;
        assert!(b.eject(0, now));
        assert!(!b.eject(0, now));
        assert_eq!(b.pick(&[], now), Some(1));
        assert_eq!(b.pick(&[1], now), Some(0)); // only the ejected one left
        assert_eq!(b.pick(&[0, 1], now), None);
    }
}
