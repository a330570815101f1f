//! The crate's one error type. Variants are grouped by what the caller did
//! wrong, so the gateway can map each to a status code in one place: too
//! large (413), not an image we take (415/400), a broken image (400/422), a
//! bad preprocessor config (a start-up error, never a request's).

use thiserror::Error;

/// Why an image could not be prepared, or a config not loaded.
#[derive(Debug, Error)]
pub enum PrepError {
    /// The encoded image is over [`crate::Limits::max_encoded_bytes`].
    #[error("image is {bytes} bytes encoded; the limit is {limit}")]
    EncodedTooLarge { bytes: usize, limit: usize },
    /// The image (as its header declares it, or as the resize would make
    /// it) has more pixels than [`crate::Limits::max_pixels`]. Found before
    /// any pixel buffer is allocated.
    #[error("image would be {width}x{height} pixels {stage}; the limit is {limit} pixels")]
    TooManyPixels {
        width: u32,
        height: u32,
        stage: &'static str,
        limit: u64,
    },
    /// No bytes, or a header declaring zero pixels.
    #[error("image is empty: {0}")]
    Empty(&'static str),
    /// Not JPEG, PNG, WebP or GIF, or a feature of one that the decoder
    /// does not implement.
    #[error("unsupported image: {0}")]
    Unsupported(String),
    /// A supported format whose bytes do not decode (corrupt or truncated).
    #[error("image could not be decoded: {0}")]
    Corrupt(String),
    /// The preprocessor config asks for something this crate does not do,
    /// or is malformed.
    #[error("preprocessor config: {0}")]
    Config(String),
}
