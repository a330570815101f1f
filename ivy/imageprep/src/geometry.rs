//! Sizes and the centre crop, with transformers' arithmetic.

use crate::Rgb8;

/// PIL's resampling filters that the processors use (PIL numbers them
/// 2 and 3 in `resample`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// PIL `BILINEAR` (2): a triangle filter.
    Bilinear,
    /// PIL `BICUBIC` (3): the cubic kernel with a = -0.5 (Catmull-Rom).
    Bicubic,
}

/// The `size` of a preprocessor config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// Scale so the shorter side is this long, keeping the aspect ratio (CLIP).
    ShortestEdge(u32),
    /// Scale to exactly this (SigLIP).
    Exact { height: u32, width: u32 },
}

impl Size {
    /// The (height, width) an image of `height` x `width` is resized to, as
    /// transformers' `get_resize_output_image_size` computes it: the longer
    /// side is `int(size * long / short)`, truncated, with the division in
    /// floating point (exact for any real image size, as in Python).
    pub fn output(self, height: u32, width: u32) -> (u32, u32) {
        match self {
            Size::Exact { height, width } => (height, width),
            Size::ShortestEdge(size) => {
                let (short, long) = if width <= height {
                    (width, height)
                } else {
                    (height, width)
                };
                let new_long = (f64::from(size) * f64::from(long) / f64::from(short)) as u32;
                if width <= height {
                    (new_long, size)
                } else {
                    (size, new_long)
                }
            }
        }
    }
}

/// transformers' `center_crop`: the window starts at `(size - crop) // 2`
/// (floor division, so an odd margin leaves the extra pixel at the bottom
/// and right), and where the image is smaller than the crop the rest is
/// zero (black, before rescaling), centred the same way.
pub(crate) fn center_crop(src: &Rgb8, height: u32, width: u32) -> Rgb8 {
    let top = (i64::from(src.height) - i64::from(height)).div_euclid(2);
    let left = (i64::from(src.width) - i64::from(width)).div_euclid(2);
    let mut data = vec![0u8; height as usize * width as usize * 3];
    // The output columns that land inside the source, and where they start.
    let x0 = (-left).clamp(0, i64::from(width)) as usize;
    let x1 = (i64::from(src.width) - left).clamp(0, i64::from(width)) as usize;
    for y in 0..height as usize {
        let sy = y as i64 + top;
        if sy < 0 || sy >= i64::from(src.height) || x0 >= x1 {
            continue;
        }
        let row = sy as usize * src.width as usize * 3;
        let sx0 = (x0 as i64 + left) as usize;
        let dst = &mut data[(y * width as usize + x0) * 3..(y * width as usize + x1) * 3];
        dst.copy_from_slice(&src.data[row + sx0 * 3..row + (sx0 + x1 - x0) * 3]);
    }
    Rgb8 {
        width,
        height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_edge_truncates_like_transformers() {
        // int(224 * 500 / 333) = int(336.336...) = 336; a rounding bug gives 336 too,
        // so also one that rounds up: int(20 * 53 / 37) = int(28.648...) = 28.
        assert_eq!(Size::ShortestEdge(224).output(333, 500), (224, 336));
        assert_eq!(Size::ShortestEdge(20).output(53, 37), (28, 20));
        assert_eq!(Size::ShortestEdge(20).output(37, 53), (20, 28));
        assert_eq!(Size::ShortestEdge(20).output(40, 40), (20, 20));
        assert_eq!(
            Size::Exact {
                height: 3,
                width: 5
            }
            .output(100, 7),
            (3, 5)
        );
    }

    fn ramp(width: u32, height: u32) -> Rgb8 {
        let data = (0..width * height * 3).map(|i| (i % 251) as u8).collect();
        Rgb8 {
            width,
            height,
            data,
        }
    }

    #[test]
    fn crop_takes_the_floor_offset() {
        let src = ramp(5, 4);
        let out = center_crop(&src, 1, 2);
        // top = (4-1)//2 = 1, left = (5-2)//2 = 1
        let start = (5 + 1) * 3;
        assert_eq!(out.data, src.data[start..start + 6]);
    }

    #[test]
    fn crop_larger_than_the_image_pads_with_zeros_centred() {
        let src = ramp(1, 1);
        // 3x4 from 1x1: top = (1-3)//2 = -1, left = (1-4)//2 = -2
        let out = center_crop(&src, 3, 4);
        let mut want = vec![0u8; 3 * 4 * 3];
        want[(4 + 2) * 3..(4 + 2) * 3 + 3].copy_from_slice(&src.data);
        assert_eq!(out.data, want);
    }
}
