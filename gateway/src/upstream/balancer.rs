//! Choosing a worker: least outstanding tokens between two random candidates, with ejection.

use std::time::Instant;

#[derive(Debug, Clone)]
pub struct Endpoint {
    /// this membership's own number: a worker removed and added again is a new endpoint
    pub id: u64,
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
    pub fn new(id: u64, address: &str) -> Self {
        Endpoint {
            id,
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

pub struct Balancer {
    /// by address, so that the gauges and the logs list them in one order
    pub endpoints: Vec<Endpoint>,
    pub eject_seconds: f64,
    next_id: u64,
}

impl Balancer {
    pub fn new(addresses: &[String], eject_seconds: f64) -> Self {
        let mut b = Balancer {
            endpoints: Vec::new(),
            eject_seconds,
            next_id: 0,
        };
        b.set_addresses(addresses);
        b
    }

    /// The worker set becomes `addresses` (duplicates once): workers kept keep their state
    /// (load, readiness, ejection); returns the endpoints added and those removed, each in
    /// address order.
    pub fn set_addresses(&mut self, addresses: &[String]) -> (Vec<Endpoint>, Vec<Endpoint>) {
        let mut wanted = addresses.to_vec();
        wanted.sort();
        wanted.dedup();
        let (kept, removed): (Vec<Endpoint>, Vec<Endpoint>) = std::mem::take(&mut self.endpoints)
            .into_iter()
            .partition(|e| wanted.binary_search(&e.address).is_ok());
        self.endpoints = kept;
        let mut added = Vec::new();
        for address in &wanted {
            if !self.endpoints.iter().any(|e| &e.address == address) {
                self.next_id += 1;
                added.push(Endpoint::new(self.next_id, address));
            }
        }
        self.endpoints.extend(added.iter().cloned());
        self.endpoints.sort_by(|x, y| x.address.cmp(&y.address));
        (added, removed)
    }

    pub fn get_mut(&mut self, id: u64) -> Option<&mut Endpoint> {
        self.endpoints.iter_mut().find(|e| e.id == id)
    }

    pub fn usable(&self, now: Instant) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.iter().filter(move |e| e.usable(now))
    }

    /// The endpoint to call, not in `exclude`; ejected ones only when nothing else is left
    /// (ejection is advice: trying an ejected worker beats failing).
    pub fn pick(&mut self, exclude: &[u64], now: Instant) -> Option<&mut Endpoint> {
        let allowed = |e: &&Endpoint| !exclude.contains(&e.id);
        let mut candidates: Vec<usize> = (0..self.endpoints.len())
            .filter(|&i| allowed(&&self.endpoints[i]) && self.endpoints[i].usable(now))
            .collect();
        if candidates.is_empty() {
            candidates = (0..self.endpoints.len())
                .filter(|&i| allowed(&&self.endpoints[i]) && self.endpoints[i].ready)
                .collect();
        }
        if candidates.is_empty() {
            return None;
        }
        let loads: Vec<usize> = candidates
            .iter()
            .map(|&i| self.endpoints[i].outstanding_tokens)
            .collect();
        let random = fastrand::u64(..);
        Some(&mut self.endpoints[candidates[choose(&loads, random)]])
    }

    /// True if this ejected a worker that was not already ejected (false for one removed).
    pub fn eject(&mut self, id: u64, now: Instant) -> bool {
        let seconds = self.eject_seconds;
        let Some(e) = self.get_mut(id) else {
            return false;
        };
        let fresh = e.ejected_until.is_none_or(|t| t <= now);
        e.ejected_until = Some(now + std::time::Duration::from_secs_f64(seconds));
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
        let picked = |b: &mut Balancer, exclude: &[u64]| b.pick(exclude, now).map(|e| e.id);
        assert_eq!(picked(&mut b, &[]), None);
        b.endpoints[0].ready = true;
        b.endpoints[1].ready = true;
        let (a, other) = (b.endpoints[0].id, b.endpoints[1].id);
        assert_eq!(b.endpoints[0].address, "a:1"); // kept in address order
        assert!(b.eject(a, now));
        assert!(!b.eject(a, now));
        assert_eq!(picked(&mut b, &[]), Some(other));
        assert_eq!(picked(&mut b, &[other]), Some(a)); // only the ejected one left
        assert_eq!(picked(&mut b, &[a, other]), None);
    }

    #[test]
    fn membership_changes_keep_the_state_of_workers_that_stay() {
        let mut b = Balancer::new(&["a:1".into(), "b:1".into()], 5.0);
        b.endpoints[1].ready = true;
        b.endpoints[1].outstanding_tokens = 7;
        let kept = b.endpoints[1].id;
        let (added, removed) = b.set_addresses(&["c:1".into(), "b:1".into(), "c:1".into()]);
        assert_eq!(
            added.iter().map(|e| e.address.as_str()).collect::<Vec<_>>(),
            ["c:1"]
        );
        assert_eq!(
            removed
                .iter()
                .map(|e| e.address.as_str())
                .collect::<Vec<_>>(),
            ["a:1"]
        );
        let addresses: Vec<&str> = b.endpoints.iter().map(|e| e.address.as_str()).collect();
        assert_eq!(addresses, ["b:1", "c:1"]);
        let b1 = b.get_mut(kept).unwrap();
        assert!(b1.ready && b1.outstanding_tokens == 7);
        // Removed and added again: a new endpoint, not the old one's state.
        b.set_addresses(&["b:1".into()]);
        let (again, _) = b.set_addresses(&["b:1".into(), "a:1".into()]);
        assert!(again[0].id > kept && !again[0].ready);
        assert!(!b.eject(999, Instant::now())); // a removed id: nothing to eject
    }
}
