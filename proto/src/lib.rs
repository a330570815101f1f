//! Generated gRPC types. `tulip::v1` is the internal Ivy → Tulip protocol;
//! `ivy::v1` is Ivy's public gRPC API; `frames` is the thinner envelope
//! for `tulip.v1` calls over a Unix socket.

pub mod frames;

pub mod tulip {
    pub mod v1 {
        tonic::include_proto!("tulip.v1");

        /// Metadata key on an `UNAVAILABLE` status from a Tulip that is
        /// draining (alive, finishing its work, taking no more), so that a
        /// caller tells it apart from a lost connection.
        pub const DRAINING_METADATA: &str = "tulip-draining";

        /// One reading of the output kinds for both services: how a value
        /// on the wire is understood and what each kind is called.
        impl OutputKind {
            /// The kind a request means: UNSPECIFIED is dense; `None` for a
            /// value this build does not know.
            pub fn of(value: i32) -> Option<Self> {
                match Self::try_from(value).ok()? {
                    Self::Unspecified => Some(Self::Dense),
                    kind => Some(kind),
                }
            }

            /// Whether every sequence gets exactly one row (dense, score,
            /// classify); the others carry `row_counts`.
            pub fn one_row_per_sequence(self) -> bool {
                !matches!(self, Self::Sparse | Self::MultiVector | Self::TokenStates)
            }

            /// The name in messages, `/info` and the engine interface.
            pub fn name(self) -> &'static str {
                match self {
                    Self::Unspecified | Self::Dense => "dense",
                    Self::Sparse => "sparse",
                    Self::MultiVector => "multi_vector",
                    Self::Score => "score",
                    Self::Classify => "classify",
                    Self::TokenStates => "token_states",
                }
            }
        }
    }
}

pub mod ivy {
    pub mod v1 {
        tonic::include_proto!("ivy.v1");
    }
}
