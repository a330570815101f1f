//! Inputs a gateway must refuse, each with the variant it maps to a status.

use std::io::Cursor;

use image::{ImageFormat, RgbImage};
use ivy_imageprep::{ImageProcessor, Limits, PrepError};
use serde_json::json;

fn siglip() -> ImageProcessor {
    ImageProcessor::from_config(&json!({"image_processor_type": "SiglipImageProcessor"})).unwrap()
}

fn clip() -> ImageProcessor {
    ImageProcessor::from_config(&json!({"image_processor_type": "CLIPImageProcessor"})).unwrap()
}

fn encode(width: u32, height: u32, format: ImageFormat) -> Vec<u8> {
    let img = RgbImage::from_fn(width, height, |x, y| image::Rgb([x as u8, y as u8, 7]));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A PNG whose IHDR (CRC fixed up) declares `width` x `height`, followed by
/// the small image's own data.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut png = encode(4, 4, ImageFormat::Png);
    // Signature (8), IHDR length (4), "IHDR" (4), then width and height.
    png[16..20].copy_from_slice(&width.to_be_bytes());
    png[20..24].copy_from_slice(&height.to_be_bytes());
    let crc = crc32(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    png
}

#[test]
fn a_small_png_prepares() {
    let pixels = siglip()
        .prepare(&encode(5, 3, ImageFormat::Png), &Limits::default())
        .unwrap();
    assert_eq!(
        (pixels.height, pixels.width, pixels.data.len()),
        (224, 224, 3 * 224 * 224)
    );
}

#[test]
fn a_png_bomb_is_refused_from_its_header() {
    let err = siglip()
        .prepare(&png_claiming(100_000, 100_000), &Limits::default())
        .unwrap_err();
    assert!(
        matches!(
            err,
            PrepError::TooManyPixels {
                width: 100_000,
                height: 100_000,
                stage: "decoded",
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_jpeg_bomb_is_refused_from_its_header() {
    let mut jpeg = encode(8, 8, ImageFormat::Jpeg);
    // SOF0: FF C0, length (2), precision (1), height (2), width (2).
    let sof = jpeg.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
    jpeg[sof + 5..sof + 9].copy_from_slice(&[0xEA, 0x60, 0xEA, 0x60]); // 60000 x 60000
    let err = siglip().prepare(&jpeg, &Limits::default()).unwrap_err();
    assert!(
        matches!(
            err,
            PrepError::TooManyPixels {
                width: 60_000,
                height: 60_000,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn the_pixel_bound_is_the_limit_given() {
    let png = encode(20, 10, ImageFormat::Png);
    let tight = Limits {
        max_pixels: 199,
        ..Limits::default()
    };
    assert!(matches!(
        siglip().prepare(&png, &tight),
        Err(PrepError::TooManyPixels { .. })
    ));
    let fits = Limits {
        max_pixels: 224 * 224,
        ..Limits::default()
    };
    assert!(siglip().prepare(&png, &fits).is_ok());
}

#[test]
fn a_sliver_cannot_make_the_resize_huge() {
    // 1 x 4000 is 4000 pixels, but a 224 shortest edge makes it 224 x 896000.
    let png = encode(1, 4000, ImageFormat::Png);
    let err = clip().prepare(&png, &Limits::default()).unwrap_err();
    assert!(matches!(
        err,
        PrepError::TooManyPixels {
            width: 224,
            height: 896_000,
            stage: "after resizing",
            ..
        }
    ));
}

#[test]
fn too_many_bytes_are_refused_before_anything_else() {
    let png = encode(4, 4, ImageFormat::Png);
    let limits = Limits {
        max_encoded_bytes: png.len() - 1,
        ..Limits::default()
    };
    let err = siglip().prepare(&png, &limits).unwrap_err();
    assert!(
        matches!(err, PrepError::EncodedTooLarge { bytes, limit } if bytes == png.len() && limit == bytes - 1)
    );
}

#[test]
fn empty_and_zero_pixel_images_are_empty() {
    assert!(matches!(
        siglip().prepare(&[], &Limits::default()),
        Err(PrepError::Empty(_))
    ));
    // A GIF whose logical screen is 0 x 0 gets past its decoder, so the
    // crate's own check answers.
    let mut gif = encode(2, 2, ImageFormat::Gif);
    gif[6..10].fill(0);
    let err = siglip().prepare(&gif, &Limits::default()).unwrap_err();
    assert!(matches!(err, PrepError::Empty(_)), "{err:?}");
    // PNG forbids a zero dimension: its decoder calls the header malformed.
    let err = siglip()
        .prepare(&png_claiming(0, 4), &Limits::default())
        .unwrap_err();
    assert!(matches!(err, PrepError::Corrupt(_)), "{err:?}");
}

#[test]
fn unknown_formats_are_unsupported() {
    // Text; a BMP and a TIFF signature (formats `image` knows, not enabled).
    let mut bmp = b"BM".to_vec();
    bmp.resize(64, 0);
    for bytes in [
        &b"hello, this is not an image"[..],
        &bmp,
        b"II*\0\x08\0\0\0\0\0",
    ] {
        let err = siglip().prepare(bytes, &Limits::default()).unwrap_err();
        assert!(matches!(err, PrepError::Unsupported(_)), "{err:?}");
    }
}

#[test]
fn truncated_and_corrupt_images_are_corrupt() {
    for format in [
        ImageFormat::Png,
        ImageFormat::Jpeg,
        ImageFormat::Gif,
        ImageFormat::WebP,
    ] {
        let whole = encode(16, 16, format);
        let truncated = &whole[..whole.len() * 2 / 3];
        let err = siglip().prepare(truncated, &Limits::default()).unwrap_err();
        assert!(
            matches!(err, PrepError::Corrupt(_)),
            "{format:?} truncated: {err:?}"
        );

        // The signature survives, the rest is noise.
        let mut corrupt = whole.clone();
        for (i, b) in corrupt.iter_mut().enumerate().skip(16) {
            *b = (i as u8).wrapping_mul(151).wrapping_add(17);
        }
        let err = siglip().prepare(&corrupt, &Limits::default()).unwrap_err();
        assert!(
            matches!(err, PrepError::Corrupt(_) | PrepError::Unsupported(_)),
            "{format:?} corrupt: {err:?}"
        );
    }
}
