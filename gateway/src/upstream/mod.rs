//! The workers: where they are (discovery), which are live (the pool), which takes a call
//! (the balancer), how small calls share a message (coalescing, the stream), and what a call's
//! reply or failure means.

pub mod balancer;
pub mod batch;
pub mod coalescing;
pub mod discovery;
pub mod failure;
pub mod pool;
pub mod proto;
pub mod stream;
