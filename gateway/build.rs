//! Compiles the one gateway <-> worker protocol file the workers serve (never a copy), and
//! the part of OTLP's trace protocol the gateway exports spans with, with a vendored protoc so a
//! fresh machine needs nothing installed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../common/src/embedfleet/common/proto/embedfleet.proto";
    println!("cargo:rerun-if-changed={proto}");
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    tonic_build::configure()
        .build_server(false)
        .compile_protos(&[proto], &["../common/src"])?;
    let otlp = "proto/otlp_trace.proto";
    println!("cargo:rerun-if-changed={otlp}");
    tonic_build::configure()
        .build_server(false)
        .compile_protos(&[otlp], &["proto"])?;
    Ok(())
}
