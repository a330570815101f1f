//! Ivy's image preparation: an encoded image (JPEG, PNG, WebP, GIF) becomes
//! the pixel tensor a vision tower takes, exactly as the model's
//! `preprocessor_config.json` says, so the GPU side never decodes images.
//!
//! The pipeline is transformers' PIL-backed processor, step for step:
//! decode → EXIF orientation → RGB (alpha onto white) → resize (PIL's
//! convolution, 8-bit between passes) → centre crop → rescale → normalise,
//! output CHW `f32`.

mod config;
mod decode;
mod error;
mod geometry;
mod resample;

pub use decode::Limits;
pub use error::PrepError;
pub use geometry::{Filter, Size};

/// One image's pixels for the vision tower: channels-first RGB, `f32`.
#[derive(Debug, Clone, PartialEq)]
pub struct Pixels {
    pub height: u32,
    pub width: u32,
    /// `3 * height * width` values, channel by channel, row by row.
    pub data: Vec<f32>,
}

/// 8-bit interleaved RGB, the working form between decoding and the tensor.
#[derive(Debug, Clone)]
pub(crate) struct Rgb8 {
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
}

/// A model's image preprocessing, read from its `preprocessor_config.json`
/// by [`ImageProcessor::from_config`].
#[derive(Debug, Clone, PartialEq)]
pub struct ImageProcessor {
    resize: Option<(Size, Filter)>,
    /// (height, width).
    crop: Option<(u32, u32)>,
    rescale: Option<f64>,
    /// Per-channel (mean, std).
    normalize: Option<([f64; 3], [f64; 3])>,
}

impl ImageProcessor {
    /// Decodes `bytes` within `limits` and prepares them as the config says.
    pub fn prepare(&self, bytes: &[u8], limits: &Limits) -> Result<Pixels, PrepError> {
        let mut rgb = decode::decode_rgb(bytes, limits)?;
        if let Some((size, filter)) = self.resize {
            let (height, width) = size.output(rgb.height, rgb.width);
            // An extreme aspect ratio under a shortest-edge rule can ask for
            // far more pixels than the image has.
            decode::check_pixels(width, height, "after resizing", limits)?;
            rgb = resample::resize(rgb, height, width, filter);
        }
        if let Some((height, width)) = self.crop {
            rgb = geometry::center_crop(&rgb, height, width);
        }
        Ok(self.tensor(&rgb))
    }

    /// The (height, width) every prepared image has, when the config fixes
    /// it (a centre crop, or an exact resize); `None` when it follows each
    /// image's aspect ratio.
    pub fn fixed_size(&self) -> Option<(u32, u32)> {
        match (self.crop, self.resize) {
            (Some(crop), _) => Some(crop),
            (None, Some((Size::Exact { height, width }, _))) => Some((height, width)),
            _ => None,
        }
    }

    /// Rescale and normalise in transformers' precisions: the rescale in
    /// `f64` then cast to `f32`, the normalisation in `f32`, so the result
    /// is bit-identical for the same 8-bit input.
    fn tensor(&self, rgb: &Rgb8) -> Pixels {
        let plane = rgb.width as usize * rgb.height as usize;
        let mut data = vec![0f32; 3 * plane];
        for c in 0..3 {
            let (mean, std) = match self.normalize {
                Some((mean, std)) => (mean[c] as f32, std[c] as f32),
                None => (0.0, 1.0),
            };
            let out = &mut data[c * plane..(c + 1) * plane];
            for (o, px) in out.iter_mut().zip(rgb.data.chunks_exact(3)) {
                let v = match self.rescale {
                    Some(factor) => (f64::from(px[c]) * factor) as f32,
                    None => f32::from(px[c]),
                };
                *o = if self.normalize.is_some() {
                    (v - mean) / std
                } else {
                    v
                };
            }
        }
        Pixels {
            height: rgb.height,
            width: rgb.width,
            data,
        }
    }
}
