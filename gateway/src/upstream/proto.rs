//! The generated gateway -> worker protocol (build.rs compiles common's embedfleet.proto).
#![allow(clippy::all, clippy::pedantic)]
tonic::include_proto!("embedfleet.v1");
