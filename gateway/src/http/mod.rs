//! The HTTP server: connections and the bounds on them, routes, API keys.

pub mod auth;
pub mod connection;
pub mod routes;
pub mod server;
