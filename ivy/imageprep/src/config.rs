//! `preprocessor_config.json` → [`ImageProcessor`], with the defaults of the
//! transformers class the file names, so a key that is absent (or `null`)
//! means what it means to transformers.

use serde_json::{Map, Value};

use crate::{
    error::PrepError,
    geometry::{Filter, Size},
    ImageProcessor,
};

/// OpenAI CLIP's normalisation (transformers' `OPENAI_CLIP_MEAN`/`_STD`).
const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// transformers' `IMAGENET_STANDARD_MEAN`/`_STD`, SigLIP's default.
const HALF: [f64; 3] = [0.5, 0.5, 0.5];

/// What a processor class assumes for every key a config leaves out.
struct Defaults {
    size: Size,
    crop: Option<(u32, u32)>,
    do_center_crop: bool,
    mean: [f64; 3],
    std: [f64; 3],
}

fn defaults(kind: &str) -> Result<Defaults, PrepError> {
    // Saved "Fast" configs carry the same keys; the PIL pipeline is the one
    // reproduced here either way.
    match kind.strip_suffix("Fast").unwrap_or(kind) {
        "CLIPImageProcessor" | "CLIPFeatureExtractor" => Ok(Defaults {
            size: Size::ShortestEdge(224),
            crop: Some((224, 224)),
            do_center_crop: true,
            mean: CLIP_MEAN,
            std: CLIP_STD,
        }),
        "SiglipImageProcessor" => Ok(Defaults {
            size: Size::Exact {
                height: 224,
                width: 224,
            },
            crop: None,
            do_center_crop: false,
            mean: HALF,
            std: HALF,
        }),
        other => Err(PrepError::Config(format!(
            "image processor {other:?} is not supported (CLIPImageProcessor, SiglipImageProcessor)"
        ))),
    }
}

impl ImageProcessor {
    /// Reads a transformers `preprocessor_config.json` for
    /// `CLIPImageProcessor` or `SiglipImageProcessor` (the legacy
    /// `CLIPFeatureExtractor` spelling included). Anything it cannot honour
    /// exactly (another processor, another resampling filter, a size rule
    /// other than shortest edge or height x width) is refused, naming it.
    pub fn from_config(json: &Value) -> Result<Self, PrepError> {
        let obj = json
            .as_object()
            .ok_or_else(|| bad("the config is not a JSON object"))?;
        let kind = ["image_processor_type", "feature_extractor_type"]
            .iter()
            .find_map(|k| obj.get(*k).and_then(Value::as_str))
            .ok_or_else(|| bad("no image_processor_type"))?;
        let d = defaults(kind)?;

        let filter = match get(obj, "resample").map(|v| v.as_u64()) {
            None | Some(Some(3)) => Filter::Bicubic,
            Some(Some(2)) => Filter::Bilinear,
            Some(_) => {
                return Err(bad(format!(
                    "resample {} is not supported: only 2 (bilinear) and 3 (bicubic)",
                    obj["resample"]
                )))
            }
        };
        let resize = if flag(obj, "do_resize", true)? {
            let size = match get(obj, "size") {
                None => d.size,
                Some(v) => size(v)?,
            };
            Some((size, filter))
        } else {
            None
        };
        let crop = if flag(obj, "do_center_crop", d.do_center_crop)? {
            match get(obj, "crop_size") {
                Some(v) => Some(crop_size(v)?),
                None => Some(
                    d.crop
                        .ok_or_else(|| bad("do_center_crop is set but crop_size is not"))?,
                ),
            }
        } else {
            None
        };
        let rescale = if flag(obj, "do_rescale", true)? {
            let factor = match get(obj, "rescale_factor") {
                None => 1.0 / 255.0,
                Some(v) => v
                    .as_f64()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| bad("rescale_factor is not a number"))?,
            };
            Some(factor)
        } else {
            None
        };
        let normalize = if flag(obj, "do_normalize", true)? {
            let mean = triple(obj, "image_mean", d.mean)?;
            let std = triple(obj, "image_std", d.std)?;
            if std.contains(&0.0) {
                return Err(bad("image_std has a zero"));
            }
            Some((mean, std))
        } else {
            None
        };
        // `do_convert_rgb` is read for its type only: a vision tower takes
        // three channels, so every image becomes RGB whatever it says.
        flag(obj, "do_convert_rgb", true)?;
        Ok(ImageProcessor {
            resize,
            crop,
            rescale,
            normalize,
        })
    }
}

fn bad(msg: impl Into<String>) -> PrepError {
    PrepError::Config(msg.into())
}

/// A key's value; `null` counts as absent, as transformers falls back to
/// the class default for `None`.
fn get<'a>(obj: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn flag(obj: &Map<String, Value>, key: &str, default: bool) -> Result<bool, PrepError> {
    match get(obj, key) {
        None => Ok(default),
        Some(v) => v
            .as_bool()
            .ok_or_else(|| bad(format!("{key} is not a boolean"))),
    }
}

fn positive(v: &Value, what: &str) -> Result<u32, PrepError> {
    v.as_u64()
        .filter(|&n| n > 0)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| bad(format!("{what} is not a positive integer: {v}")))
}

/// `size`: an integer is the shortest edge (both classes set
/// `default_to_square = False`), a dict has `shortest_edge` or
/// `height` + `width`, a pair is (height, width).
fn size(v: &Value) -> Result<Size, PrepError> {
    if v.is_number() {
        return Ok(Size::ShortestEdge(positive(v, "size")?));
    }
    if let Some(obj) = v.as_object() {
        let set: Vec<&str> = obj
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| k.as_str())
            .collect();
        match set.as_slice() {
            ["shortest_edge"] => {
                return Ok(Size::ShortestEdge(positive(
                    &obj["shortest_edge"],
                    "size.shortest_edge",
                )?))
            }
            ["height", "width"] | ["width", "height"] => {
                let (height, width) = hw(obj, "size")?;
                return Ok(Size::Exact { height, width });
            }
            _ => {}
        }
    }
    if let Some((height, width)) = pair(v, "size")? {
        return Ok(Size::Exact { height, width });
    }
    Err(bad(format!(
        "size {v} is not supported: an integer, {{\"shortest_edge\"}} or {{\"height\", \"width\"}}"
    )))
}

/// `crop_size`: an integer is a square, a dict has `height` + `width`, a
/// pair is (height, width). Returns (height, width).
fn crop_size(v: &Value) -> Result<(u32, u32), PrepError> {
    if v.is_number() {
        let n = positive(v, "crop_size")?;
        return Ok((n, n));
    }
    if let Some(obj) = v.as_object() {
        return hw(obj, "crop_size");
    }
    pair(v, "crop_size")?.ok_or_else(|| bad(format!("crop_size {v} is not supported")))
}

fn hw(obj: &Map<String, Value>, what: &str) -> Result<(u32, u32), PrepError> {
    let field = |k: &str| {
        obj.get(k)
            .ok_or_else(|| bad(format!("{what} has no {k}")))
            .and_then(|v| positive(v, &format!("{what}.{k}")))
    };
    Ok((field("height")?, field("width")?))
}

fn pair(v: &Value, what: &str) -> Result<Option<(u32, u32)>, PrepError> {
    match v.as_array().map(Vec::as_slice) {
        Some([h, w]) => Ok(Some((positive(h, what)?, positive(w, what)?))),
        _ => Ok(None),
    }
}

/// `image_mean` / `image_std`: three numbers, or one for all channels.
fn triple(obj: &Map<String, Value>, key: &str, default: [f64; 3]) -> Result<[f64; 3], PrepError> {
    let Some(v) = get(obj, key) else {
        return Ok(default);
    };
    let num = |v: &Value| {
        v.as_f64()
            .ok_or_else(|| bad(format!("{key} is not numbers: {v}")))
    };
    if v.is_number() {
        let x = num(v)?;
        return Ok([x, x, x]);
    }
    match v.as_array().map(Vec::as_slice) {
        Some([a, b, c]) => Ok([num(a)?, num(b)?, num(c)?]),
        _ => Err(bad(format!(
            "{key} must have 3 values (one per RGB channel): {v}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn legacy_clip_takes_class_defaults() {
        let p = ImageProcessor::from_config(&json!({
            "feature_extractor_type": "CLIPFeatureExtractor", "size": 224, "crop_size": 224, "resample": 3
        }))
        .unwrap();
        assert_eq!(p.resize, Some((Size::ShortestEdge(224), Filter::Bicubic)));
        assert_eq!(p.crop, Some((224, 224)));
        assert_eq!(p.rescale, Some(1.0 / 255.0));
        assert_eq!(p.normalize, Some((CLIP_MEAN, CLIP_STD)));
    }

    #[test]
    fn siglip_has_no_crop_by_default() {
        let p = ImageProcessor::from_config(&json!({
            "image_processor_type": "SiglipImageProcessor", "size": {"height": 384, "width": 384},
            "resample": 2, "do_center_crop": null
        }))
        .unwrap();
        assert_eq!(
            p.resize,
            Some((
                Size::Exact {
                    height: 384,
                    width: 384
                },
                Filter::Bilinear
            ))
        );
        assert_eq!(p.crop, None);
        assert_eq!(p.normalize, Some((HALF, HALF)));
    }

    #[test]
    fn refusals_name_what_is_wrong() {
        let cases = [
            (
                json!({"image_processor_type": "ViTImageProcessor"}),
                "ViTImageProcessor",
            ),
            (json!({"size": 3}), "no image_processor_type"),
            (
                json!({"image_processor_type": "CLIPImageProcessor", "resample": 1}),
                "resample 1",
            ),
            (
                json!({"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 3, "longest_edge": 9}}),
                "size",
            ),
            (
                json!({"image_processor_type": "CLIPImageProcessor", "image_mean": [0.5, 0.5]}),
                "image_mean",
            ),
            (
                json!({"image_processor_type": "CLIPImageProcessor", "image_std": 0}),
                "zero",
            ),
            (
                json!({"image_processor_type": "SiglipImageProcessor", "do_center_crop": true}),
                "crop_size",
            ),
            (
                json!({"image_processor_type": "CLIPImageProcessor", "do_resize": "yes"}),
                "do_resize",
            ),
            (
                json!({"image_processor_type": "CLIPImageProcessor", "crop_size": {"height": 0, "width": 2}}),
                "crop_size.height",
            ),
        ];
        for (config, needle) in cases {
            let err = ImageProcessor::from_config(&config).unwrap_err();
            assert!(matches!(err, PrepError::Config(_)), "{config}: {err:?}");
            assert!(
                err.to_string().contains(needle),
                "{config}: {err} lacks {needle:?}"
            );
        }
    }
}
