//! Compiles the one gateway <-> worker protocol file (never a copy) for its messages, and the
//! Worker service's server side from hand-listed methods: Embed and EmbedStream carry their
//! messages as raw bytes (codec.rs), so the Python engine parses and builds them with the
//! functions the Python front uses; Info's reply is a prost message filled in here.
use tonic_build::manual::{Builder, Method, MethodBuilder, Service};

const RAW: &str = "crate::codec::RawCodec";
const PROST: &str = "tonic::codec::ProstCodec";

fn method(name: &str, route: &str, types: (&str, &str), codec: &str) -> MethodBuilder {
    Method::builder()
        .name(name)
        .route_name(route)
        .input_type(types.0)
        .output_type(types.1)
        .codec_path(codec)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../common/src/embedfleet/common/proto/embedfleet.proto";
    println!("cargo:rerun-if-changed={proto}");
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    tonic_build::configure()
        .build_server(false)
        .build_client(false)
        .compile_protos(&[proto], &["../common/src"])?;
    let raw = ("bytes::Bytes", "bytes::Bytes");
    let info = ("crate::pb::InfoRequest", "crate::pb::InfoResponse");
    // Every unary method carrying a TokenBatch; EmbedStream; Info.
    let mut worker = Service::builder().name("Worker").package("embedfleet.v1");
    for (name, route) in [
        ("embed", "Embed"),
        ("score", "Score"),
        ("classify", "Classify"),
        ("sparse_embed", "SparseEmbed"),
        ("multi_vector_embed", "MultiVectorEmbed"),
        ("hybrid_embed", "HybridEmbed"),
    ] {
        worker = worker.method(method(name, route, raw, RAW).build());
    }
    let worker = worker
        .method(
            method("embed_stream", "EmbedStream", raw, RAW)
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .method(method("info", "Info", info, PROST).build())
        .build();
    Builder::new().build_client(false).compile(&[worker]);
    Ok(())
}
