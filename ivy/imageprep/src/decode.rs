//! Encoded bytes → upright 8-bit RGB, bounded before anything is allocated.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageError, ImageFormat, ImageReader};

use crate::{error::PrepError, Rgb8};

/// Bounds on what one request may make the gateway decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest encoded image accepted, in bytes.
    pub max_encoded_bytes: usize,
    /// The most pixels (width x height) an image may declare, checked on the
    /// header before decoding, and again on the size a resize would make.
    pub max_pixels: u64,
}

impl Default for Limits {
    /// 20 MiB encoded and 40 megapixels: a phone camera's full-size photo
    /// passes, a decompression bomb does not.
    fn default() -> Self {
        Limits {
            max_encoded_bytes: 20 << 20,
            max_pixels: 40_000_000,
        }
    }
}

/// Bytes per pixel of the widest buffer a decoder may build (RGBA, 16 bits).
const WIDEST_PIXEL: u64 = 8;
/// Room for a decoder's own tables and row buffers beyond the image itself.
const DECODER_SLACK: u64 = 16 << 20;

/// Decodes JPEG, PNG, WebP or GIF (its first frame), applies the EXIF
/// orientation and converts to RGB as transformers does: alpha composited
/// onto white, grey replicated.
pub(crate) fn decode_rgb(bytes: &[u8], limits: &Limits) -> Result<Rgb8, PrepError> {
    if bytes.is_empty() {
        return Err(PrepError::Empty("no bytes"));
    }
    if bytes.len() > limits.max_encoded_bytes {
        return Err(PrepError::EncodedTooLarge {
            bytes: bytes.len(),
            limit: limits.max_encoded_bytes,
        });
    }
    let format = image::guess_format(bytes)
        .map_err(|_| PrepError::Unsupported("not a JPEG, PNG, WebP or GIF image".into()))?;
    if !matches!(
        format,
        ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP | ImageFormat::Gif
    ) {
        return Err(PrepError::Unsupported(format!(
            "{format:?} images are not accepted (JPEG, PNG, WebP, GIF)"
        )));
    }
    let mut reader = ImageReader::with_format(Cursor::new(bytes), format);
    // Opening reads the header only; our own bound below says why a bomb is
    // refused, the decoder's allocation bound is set once that has passed.
    reader.no_limits();
    let mut decoder = reader.into_decoder().map_err(|e| decode_error(e, None))?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(PrepError::Empty("the header declares zero pixels"));
    }
    check_pixels(width, height, "decoded", limits)?;
    let mut bound = image::Limits::default();
    bound.max_alloc = Some(
        limits
            .max_pixels
            .saturating_mul(WIDEST_PIXEL)
            .saturating_add(DECODER_SLACK),
    );
    decoder
        .set_limits(bound)
        .map_err(|e| decode_error(e, None))?;
    // An unreadable EXIF block leaves the image as stored rather than
    // refusing an otherwise good picture.
    let orientation = decoder
        .orientation()
        .unwrap_or(image::metadata::Orientation::NoTransforms);
    let mut image = DynamicImage::from_decoder(decoder)
        .map_err(|e| decode_error(e, Some((width, height, limits.max_pixels))))?;
    image.apply_orientation(orientation);
    Ok(to_rgb(image))
}

/// Refuses a `width` x `height` image over the pixel bound.
pub(crate) fn check_pixels(
    width: u32,
    height: u32,
    stage: &'static str,
    limits: &Limits,
) -> Result<(), PrepError> {
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(PrepError::TooManyPixels {
            width,
            height,
            stage,
            limit: limits.max_pixels,
        });
    }
    Ok(())
}

fn decode_error(e: ImageError, size: Option<(u32, u32, u64)>) -> PrepError {
    match e {
        ImageError::Limits(_) => {
            let (width, height, limit) = size.unwrap_or((0, 0, 0));
            PrepError::TooManyPixels {
                width,
                height,
                stage: "decoded",
                limit,
            }
        }
        ImageError::Unsupported(e) => PrepError::Unsupported(e.to_string()),
        // Truncated input surfaces as an I/O error (unexpected end of file).
        other => PrepError::Corrupt(other.to_string()),
    }
}

/// PIL's `convert("RGB")` for opaque images; for images with an alpha
/// channel, transformers' `convert_to_rgb`: alpha-composite onto opaque
/// white. With an opaque white background PIL's fixed-point composite
/// equals `round((c*a + 255*(255-a)) / 255)` for every (c, a) (checked
/// exhaustively against Pillow), and 255 is odd so no value is a tie.
fn to_rgb(image: DynamicImage) -> Rgb8 {
    let (width, height) = (image.width(), image.height());
    let data = if image.color().has_alpha() {
        let rgba = image.into_rgba8().into_raw();
        let mut out = Vec::with_capacity(rgba.len() / 4 * 3);
        for px in rgba.chunks_exact(4) {
            let a = u32::from(px[3]);
            for &c in &px[..3] {
                out.push(((u32::from(c) * a + 255 * (255 - a) + 127) / 255) as u8);
            }
        }
        out
    } else {
        image.into_rgb8().into_raw()
    };
    Rgb8 {
        width,
        height,
        data,
    }
}
