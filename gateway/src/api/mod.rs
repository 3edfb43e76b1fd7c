//! The contract a client sees: how requests are read, every refusal (the error catalog), and
//! the OpenAPI document. Imports no other layer.

pub mod errors;
pub mod openapi;
pub mod request;
