// Generates the v0 API from the handler's own copy of Akri's .proto (protoc from $PROTOC).
fn main() -> Result<(), Box<dyn std::error::Error>> {
    tonic_prost_build::configure().compile_protos(&["discovery.proto"], &["."])?;
    Ok(())
}
