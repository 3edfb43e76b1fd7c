//! The process and its served models: each endpoint from a parsed request to its response
//! document, through the plan and the workers; TEI's and Cohere's routes answer through the
//! same endpoints, in their own shapes (tei.rs, cohere.rs).

pub mod build;
pub mod cohere;
pub mod documents;
pub mod gateway;
pub mod service;
pub mod tei;
