//! The contract a client sees: how requests are read (the OpenAI-style routes', TEI's and
//! Cohere's), the routes and their keys, every refusal (the error catalog), and the OpenAPI
//! document. Imports no other layer.

pub mod cohere;
pub mod errors;
pub mod openapi;
pub mod request;
pub mod routes;
pub mod tei;
