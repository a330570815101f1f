//! The model's quantization ranges: per output setting (dimensions,
//! normalize), the minimum and maximum of every dimension over a
//! calibration corpus the model embedded once, or over a ranges file.
//! int8/uint8 vectors are cut from these ranges, never from a request's own
//! batch, so a text's quantized vector does not depend on its neighbours.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::{BoxFuture, FutureExt, Shared};
use serde::{Deserialize, Serialize};

/// One output setting's ranges, in the shape `GET /quantization/ranges`
/// answers and `--quantization-ranges` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ranges {
    pub model: String,
    pub dimensions: u32,
    pub normalize: bool,
    /// Where they come from: `builtin:…`, a corpus file, or a ranges file.
    pub source: String,
    /// How many texts were embedded to find them.
    pub texts: usize,
    /// `[minimums, maximums]`, per dimension: sentence-transformers'
    /// `ranges` argument of `quantize_embeddings`.
    pub ranges: [Vec<f32>; 2],
}

impl Ranges {
    /// The ranges of `rows` (`dim` values each).
    pub fn of_rows<'a>(
        rows: impl Iterator<Item = &'a [f32]>,
        dim: usize,
    ) -> ([Vec<f32>; 2], usize) {
        let mut min = vec![f32::INFINITY; dim];
        let mut max = vec![f32::NEG_INFINITY; dim];
        let mut n = 0;
        for row in rows {
            n += 1;
            for ((lo, hi), &v) in min.iter_mut().zip(max.iter_mut()).zip(row) {
                *lo = lo.min(v);
                *hi = hi.max(v);
            }
        }
        ([min, max], n)
    }
}

/// An output setting: (dimensions, normalize), both resolved.
pub type Key = (u32, bool);

/// The calibration corpus embedded once by the model: full dimension, not
/// normalized, so that every setting's ranges follow from it (truncate,
/// then normalize, as the replicas do).
#[derive(Debug)]
pub struct Corpus {
    pub source: String,
    pub dim: usize,
    /// `texts` rows of `dim` values.
    pub rows: Vec<f32>,
}

impl Corpus {
    /// `key`'s ranges over the corpus.
    pub fn ranges(&self, model: &str, key: Key) -> Ranges {
        let d = (key.0 as usize).min(self.dim);
        let rows = self.rows.chunks_exact(self.dim.max(1)).map(|row| {
            let mut v = row[..d].to_vec();
            if key.1 {
                let norm = v
                    .iter()
                    .map(|x| f64::from(*x).powi(2))
                    .sum::<f64>()
                    .sqrt()
                    .max(1e-12);
                v.iter_mut()
                    .for_each(|x| *x = (f64::from(*x) / norm) as f32);
            }
            v
        });
        let rows: Vec<Vec<f32>> = rows.collect();
        let (ranges, texts) = Ranges::of_rows(rows.iter().map(Vec::as_slice), d);
        Ranges {
            model: model.to_string(),
            dimensions: key.0,
            normalize: key.1,
            source: self.source.clone(),
            texts,
            ranges,
        }
    }
}

/// The corpus embedding in progress or done, shared by every request
/// waiting on it (it runs on its own task: a request that gives up does not
/// stop it).
pub type Pending = Shared<BoxFuture<'static, Result<Arc<Corpus>, String>>>;

#[derive(Default)]
pub struct Calibrations {
    corpus: Mutex<Option<Pending>>,
    /// Ranges per setting, once derived (or read from a ranges file).
    known: Mutex<HashMap<Key, Arc<Ranges>>>,
}

impl Calibrations {
    /// The embedded corpus, started with `start` if nothing has yet.
    pub fn corpus(
        &self,
        start: impl FnOnce() -> BoxFuture<'static, Result<Arc<Corpus>, String>>,
    ) -> Pending {
        let mut corpus = self.corpus.lock().expect("calibration lock poisoned");
        corpus.get_or_insert_with(|| start().shared()).clone()
    }

    /// Drops a failed calibration so that the next request tries again.
    pub fn forget(&self) {
        *self.corpus.lock().expect("calibration lock poisoned") = None;
    }

    pub fn known(&self, key: Key) -> Option<Arc<Ranges>> {
        self.known
            .lock()
            .expect("calibration lock poisoned")
            .get(&key)
            .cloned()
    }

    pub fn remember(&self, ranges: Arc<Ranges>) {
        let key = (ranges.dimensions, ranges.normalize);
        self.known
            .lock()
            .expect("calibration lock poisoned")
            .insert(key, ranges);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_follows_from_the_corpus() {
        let corpus = Corpus {
            source: "t".into(),
            dim: 3,
            rows: vec![3.0, 4.0, 1.0, -1.0, 0.0, 2.0],
        };
        let full = corpus.ranges("m", (3, false));
        assert_eq!(full.ranges, [vec![-1.0, 0.0, 1.0], vec![3.0, 4.0, 2.0]]);
        // Truncated to 2, then normalized: (0.6, 0.8) and (-1, 0).
        let short = corpus.ranges("m", (2, true));
        assert_eq!(short.ranges, [vec![-1.0, 0.0], vec![0.6, 0.8]]);
        assert_eq!((short.texts, short.dimensions), (2, 2));
    }

    #[test]
    fn ranges_are_per_dimension_extremes() {
        let rows: [&[f32]; 3] = [&[1.0, -2.0], &[0.5, 3.0], &[-1.0, 0.0]];
        let (r, n) = Ranges::of_rows(rows.into_iter(), 2);
        assert_eq!(n, 3);
        assert_eq!(r, [vec![-1.0, -2.0], vec![1.0, 3.0]]);
    }
}
