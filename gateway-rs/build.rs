//! Compiles the one gateway <-> worker protocol file the Python side uses (never a copy), with a
//! vendored protoc so a fresh machine needs nothing installed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../common/src/embedfleet/common/proto/embedfleet.proto";
    println!("cargo:rerun-if-changed={proto}");
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    tonic_build::configure()
        .build_server(false)
        .compile_protos(&[proto], &["../common/src"])?;
    Ok(())
}
