//! Deciding a request's work before any worker sees it: tokens, windows of over-long inputs,
//! chunks, whether to take it at all (admission) and whether to wait for a first worker (hold).

pub mod admission;
pub mod hold;
pub mod split;
pub mod tokenize;
pub mod windows;
pub mod wordpiece;
