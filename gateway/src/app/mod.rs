//! The process and its served models: each endpoint from a parsed request to its response
//! document, through the plan and the workers.

pub mod build;
pub mod documents;
pub mod gateway;
pub mod service;
