//! Pixel for pixel against transformers' PIL-backed processors, on the
//! fixtures `bench/harness/image_fixtures.py` writes to `tests/data`.
//!
//! Differences are counted in 8-bit steps (one uint8 level before
//! rescaling). PNG, GIF and WebP (lossy included) must match bit for bit:
//! same decoded pixels, same resampling, same float arithmetic. JPEG goes
//! through zune-jpeg rather than Pillow's libjpeg-turbo; their IDCT and
//! chroma upsampling round differently, up to 5 levels on a decoded pixel
//! with 4:2:0 chroma, up to 3 once resizing has averaged neighbours.

use std::path::{Path, PathBuf};

use ivy_imageprep::{ImageProcessor, Limits};
use serde_json::Value;

fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// The largest difference allowed, in 8-bit steps, for an image file.
fn allowed_steps(image: &str) -> f64 {
    match image.rsplit('.').next() {
        Some("jpg") => 3.0,
        _ => 0.0,
    }
}

/// One 8-bit step in normalised units, per channel: rescale / std.
fn step(config: &Value) -> [f64; 3] {
    let kind = config
        .get("image_processor_type")
        .or(config.get("feature_extractor_type"))
        .unwrap();
    let default_std = if kind.as_str().unwrap().starts_with("CLIP") {
        [0.26862954, 0.26130258, 0.27577711]
    } else {
        [0.5, 0.5, 0.5]
    };
    let std: Vec<f64> = config
        .get("image_std")
        .map(|v| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .unwrap_or(default_std.to_vec());
    let rescale = config
        .get("rescale_factor")
        .and_then(Value::as_f64)
        .unwrap_or(1.0 / 255.0);
    [rescale / std[0], rescale / std[1], rescale / std[2]]
}

#[test]
fn matches_transformers_slow_processors() {
    let dir = data();
    let Ok(manifest) = std::fs::read_to_string(dir.join("cases.json")) else {
        eprintln!(
            "skipped: no fixtures in {} (run bench/harness/image_fixtures.py)",
            dir.display()
        );
        return;
    };
    let manifest: Value = serde_json::from_str(&manifest).unwrap();
    let cases = manifest["cases"].as_array().unwrap();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    let mut failures = Vec::new();
    for case in cases {
        let (image, config_name) = (
            case["image"].as_str().unwrap(),
            case["config"].as_str().unwrap(),
        );
        let config: Value = serde_json::from_slice(
            &std::fs::read(dir.join("configs").join(format!("{config_name}.json"))).unwrap(),
        )
        .unwrap();
        let processor = ImageProcessor::from_config(&config).unwrap();
        let bytes = std::fs::read(dir.join("images").join(image)).unwrap();
        let got = processor.prepare(&bytes, &Limits::default()).unwrap();
        let want: Vec<f32> = std::fs::read(
            dir.join("expected")
                .join(case["expected"].as_str().unwrap()),
        )
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect();
        let shape: Vec<u64> = case["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(
            shape,
            [3, u64::from(got.height), u64::from(got.width)],
            "{image} with {config_name}"
        );
        assert_eq!(got.data.len(), want.len());

        let plane = got.data.len() / 3;
        let step = step(&config);
        let (mut worst, mut differing) = (0f64, 0usize);
        for (i, (g, w)) in got.data.iter().zip(&want).enumerate() {
            if g != w {
                differing += 1;
                worst = worst.max(f64::from((g - w).abs()) / step[i / plane]);
            }
        }
        println!(
            "{image:>28} {config_name:>12}: {differing:>4}/{} values differ, worst {worst:.3} steps",
            got.data.len()
        );
        // A little slack for the step arithmetic itself; real differences
        // are whole steps.
        if worst > allowed_steps(image) + 0.01 {
            failures.push(format!("{image} with {config_name}: {worst:.3} steps"));
        }
    }
    assert!(failures.is_empty(), "beyond tolerance: {failures:#?}");
}
