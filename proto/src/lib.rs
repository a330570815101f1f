//! Generated gRPC types. `tulip::v1` is the internal Ivy → Tulip protocol;
//! `ivy::v1` is Ivy's public gRPC API.

pub mod tulip {
    pub mod v1 {
        tonic::include_proto!("tulip.v1");
    }
}

pub mod ivy {
    pub mod v1 {
        tonic::include_proto!("ivy.v1");
    }
}
