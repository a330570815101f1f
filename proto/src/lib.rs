//! Generated gRPC types. `tulip::v1` is the internal Ivy → Tulip protocol;
//! `ivy::v1` is Ivy's public gRPC API.

pub mod tulip {
    pub mod v1 {
        tonic::include_proto!("tulip.v1");

        /// Metadata key on an `UNAVAILABLE` status from a Tulip that is
        /// draining (alive, finishing its work, taking no more), so that a
        /// caller tells it apart from a lost connection.
        pub const DRAINING_METADATA: &str = "tulip-draining";
    }
}

pub mod ivy {
    pub mod v1 {
        tonic::include_proto!("ivy.v1");
    }
}
