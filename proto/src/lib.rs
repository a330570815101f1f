//! Generated gRPC types. `tulip::v1` is the internal Ivy → Tulip protocol.

pub mod tulip {
    pub mod v1 {
        tonic::include_proto!("tulip.v1");
    }
}
