//! Ivy's flags for image inputs (`pipeline/images.rs`): the bounds on one
//! image and the pool that prepares them. Part of `Config` (flattened).

use clap::Args;

#[derive(Debug, Clone, Args)]
pub struct ImageConfig {
    /// Largest encoded image accepted, in bytes (413 beyond). The request
    /// body carries it base64-encoded, so --max-body-bytes bounds it too.
    #[arg(long, env = "IVY_MAX_IMAGE_BYTES", default_value_t = 20 * 1024 * 1024)]
    pub max_image_bytes: usize,

    /// Most pixels (width x height) an image may declare, checked on its
    /// header before any pixel is decoded (413 beyond: a decompression bomb
    /// never allocates its size).
    #[arg(long, env = "IVY_MAX_IMAGE_PIXELS", default_value_t = 40_000_000)]
    pub max_image_pixels: u64,

    /// Images decoded and prepared at once, each on a blocking thread; the
    /// rest wait their turn, so a burst of large images cannot take every
    /// core from tokenization and text requests. 0: half the cores (at
    /// least one).
    #[arg(long, env = "IVY_IMAGE_PREP_THREADS", default_value_t = 0)]
    pub image_prep_threads: usize,
}

impl ImageConfig {
    /// The prep pool's size, 0 resolved.
    pub fn prep_threads(&self) -> usize {
        match self.image_prep_threads {
            0 => std::thread::available_parallelism()
                .map_or(1, |n| n.get() / 2)
                .max(1),
            n => n,
        }
    }
}
