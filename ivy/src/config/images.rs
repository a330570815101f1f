//! Ivy's flags for image inputs (`pipeline/images.rs`): the bounds on one
//! image and the pool that prepares them. Part of `Config` (flattened).

use std::time::Duration;

use clap::Args;

use super::seconds::parse_seconds;

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

    /// Hosts an image may be fetched from by URL, comma-separated: a name
    /// (`images.example.com`), a domain and every name under it
    /// (`.example.com`), or an address. Empty (the default): a URL is
    /// refused and images come as bytes. Redirects are not followed, and a
    /// name resolving to a private, loopback or link-local address is
    /// refused unless that address is listed itself.
    #[arg(long, env = "IVY_IMAGE_URL_HOSTS", value_delimiter = ',')]
    pub image_url_hosts: Vec<String>,

    /// How long fetching one image by URL may take, whole (seconds).
    #[arg(long, env = "IVY_IMAGE_URL_TIMEOUT", value_parser = parse_seconds, default_value = "10")]
    pub image_url_timeout: Duration,
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
