//! embedfleet's gateway: an OpenAI-compatible HTTP front door (embeddings, rerank, score,
//! classify, sparse embeddings) that tokenizes requests, cuts them into token-budget chunks and
//! balances those over the gRPC workers, for one model or a models file's several.
//!
//! Layers, each importing only those below it (tests/layers.rs fails on any cycle):
//!
//! | layer | holds |
//! |---|---|
//! | [`http`] | the server: connections and their bounds, routes, API keys |
//! | [`app`] | the process and its served models: each endpoint from a parsed request to its document |
//! | [`plan`] | deciding a request's work: tokenization, windows, chunks, admission, the hold |
//! | [`upstream`] | the workers: discovery, the pool, balancing, coalescing, the calls and their failures |
//! | [`model`] | the served model: its directory, the catalog of served names, quantization |
//! | [`telemetry`] | metrics, logs, traces |
//! | [`api`] | the contract: request parsing, the error catalog, the OpenAPI document |
//! | [`settings`] | every setting, a flag and an env var |

pub mod api;
pub mod app;
pub mod http;
pub mod model;
pub mod plan;
pub mod settings;
pub mod telemetry;
pub mod upstream;
