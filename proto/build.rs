//! Generates the Rust code for every .proto under this folder. protoc comes
//! from `protoc-bin-vendored`, so no system package is needed to build.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let protos = ["tulip/v1/tulip.proto", "ivy/v1/ivy.proto"].map(|p| root.join(p));
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = tonic_prost_build::Config::new();
    config.protoc_executable(protoc);
    // Embedding payloads stay zero-copy `Bytes` instead of `Vec<u8>`.
    config.bytes(["."]);
    tonic_prost_build::configure().compile_with_config(config, &protos, &[root])?;
    Ok(())
}
