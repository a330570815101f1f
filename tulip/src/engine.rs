//! The boundary with the Python engine: `step(batch) -> LazyTensor` and the
//! model's description. Everything here runs with the GIL held (inside
//! `Python::attach`) on the scheduler thread; Python exceptions become typed
//! errors here, once.

use std::collections::HashMap;
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyString};

use crate::error::TulipError;
use crate::metrics::{BucketState, CpuBuckets, Mode};
use crate::model::{Adapter, ImageInfo, Kind, ModelInfo};

/// One batch as the engine's int32 arena (see `rose/interface.py`, class
/// `Batch`): ids, positions, sequence index per token, cu_seqlens, 1/length
/// (f32 bits), dimensions, normalize. Built here, outside the GIL, so the
/// Python side of a step only wraps it.
#[derive(Debug, Default)]
pub struct HostBatch {
    pub kind: Option<Kind>,
    pub sequences: usize,
    pub tokens: usize,
    pub arena: Vec<u8>,
    /// Each sequence's LoRA adapter (None: the base model); empty when no
    /// sequence has one, and the engine is then called as before.
    pub adapters: Vec<Option<std::sync::Arc<str>>>,
    /// An image step (kind `Image`): per image its dimensions and
    /// normalisation; `arena` then holds the images' float32 pixels.
    pub image_options: Vec<(u32, bool)>,
}

impl HostBatch {
    /// Builds the arena from `(token ids, dimensions, normalize)` per sequence.
    pub fn build<'a>(
        kind: Kind,
        seqs: impl ExactSizeIterator<Item = (&'a [u32], u32, bool)> + Clone,
    ) -> Self {
        let n = seqs.len();
        let t: usize = seqs.clone().map(|s| s.0.len()).sum();
        let words = 3 * t + (n + 1) + 3 * n;
        let mut a: Vec<u32> = Vec::with_capacity(words);
        for (ids, _, _) in seqs.clone() {
            a.extend_from_slice(ids);
        }
        for (ids, _, _) in seqs.clone() {
            a.extend(0..ids.len() as u32);
        }
        for (i, (ids, _, _)) in seqs.clone().enumerate() {
            a.extend(std::iter::repeat_n(i as u32, ids.len()));
        }
        a.push(0);
        let mut total = 0u32;
        for (ids, _, _) in seqs.clone() {
            total += ids.len() as u32;
            a.push(total);
        }
        a.extend(
            seqs.clone()
                .map(|(ids, _, _)| (1.0f32 / ids.len() as f32).to_bits()),
        );
        a.extend(seqs.clone().map(|(_, dims, _)| dims));
        a.extend(seqs.map(|(_, _, norm)| u32::from(norm)));
        debug_assert_eq!(a.len(), words);
        let arena = a.iter().flat_map(|w| w.to_le_bytes()).collect();
        Self {
            kind: Some(kind),
            sequences: n,
            tokens: t,
            arena,
            adapters: Vec::new(),
            image_options: Vec::new(),
        }
    }

    /// An image step from `(pixels, dimensions, normalize)` per image,
    /// each image counting `tokens_each` (for the step's metrics).
    pub fn images<'a>(
        images: impl ExactSizeIterator<Item = (&'a [u8], u32, bool)> + Clone,
        tokens_each: usize,
    ) -> Self {
        let n = images.len();
        let mut arena = Vec::with_capacity(images.clone().map(|i| i.0.len()).sum());
        for (pixels, _, _) in images.clone() {
            arena.extend_from_slice(pixels);
        }
        Self {
            kind: Some(Kind::Image),
            sequences: n,
            tokens: n * tokens_each,
            arena,
            adapters: Vec::new(),
            image_options: images.map(|(_, d, norm)| (d, norm)).collect(),
        }
    }
}

/// A launched step: the Python LazyTensor plus what Rust needs to read it.
pub struct LazyOutput {
    /// Kept alive until the rows are read, then released inside attach.
    pub obj: Py<PyAny>,
    ptr: usize,
    pub rows: usize,
    pub cols: usize,
    /// `cudaEvent_t` to wait on; 0 when the data is already on the host.
    pub event: usize,
    /// How the step ran (optional attributes of the engine's LazyTensor).
    pub mode: Mode,
    pub padded_tokens: usize,
    pub capture_seconds: f64,
}

impl LazyOutput {
    /// The output as `rows * cols` floats.
    ///
    /// # Safety
    /// The event must have completed, and `obj` must not have been released.
    pub unsafe fn data(&self) -> &[f32] {
        if self.rows * self.cols == 0 {
            return &[];
        }
        // SAFETY: the caller's contract: the step's rows are written and the
        // buffer (rows x cols floats) is still owned by `obj`.
        unsafe { std::slice::from_raw_parts(self.ptr as *const f32, self.rows * self.cols) }
    }
}

/// Attaching on a thread with no Python thread state creates one, and
/// detaching deletes it again (CPython maps and unmaps a frame stack each
/// time). Threads that attach on every step create theirs once and keep it.
/// Call while not attached.
pub fn keep_thread_state() {
    thread_local!(static KEPT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    KEPT.with(|kept| {
        if !kept.get() {
            kept.set(true);
            // SAFETY: this thread is not attached (caller's contract); the
            // state made here stays registered, then the GIL is let go.
            unsafe {
                pyo3::ffi::PyGILState_Ensure();
                pyo3::ffi::PyEval_SaveThread();
            }
        }
    });
}

pub struct EngineHandle {
    engine: Py<PyAny>,
    /// The engine's exception for a batch it refuses (the caller's fault).
    invalid_batch: Py<PyAny>,
    /// Every label a step may report (`engine.info.step_modes`).
    modes: Vec<Mode>,
    /// Whether the engine has CPU runtimes gated per bucket (read at start:
    /// without them, readiness never takes the GIL).
    cpu_runtimes: bool,
}

impl EngineHandle {
    /// The engine, with the step modes its info declares; an engine that
    /// declares none, or names a mode that cannot be a metric label, is
    /// refused before serving.
    pub fn new(py: Python<'_>, engine: Py<PyAny>, invalid_batch: Py<PyAny>) -> PyResult<Self> {
        let names: Vec<String> = engine
            .bind(py)
            .getattr("info")?
            .getattr("step_modes")
            .map_err(|_| {
                PyValueError::new_err(
                    "the engine's info has no step_modes (every label a step may report)",
                )
            })?
            .extract()?;
        let modes = Mode::declare(&names).map_err(PyValueError::new_err)?;
        let mut handle = Self {
            engine,
            invalid_batch,
            modes,
            cpu_runtimes: true,
        };
        // A runtime whose name is not a declared mode is refused here too.
        handle.cpu_runtimes = !handle.cpu_readiness(py)?.is_empty();
        Ok(handle)
    }

    /// Each CPU runtime's token buckets by state (`engine.cpu_readiness()`:
    /// a dict of runtime name → state name → count), in step-mode order;
    /// none for an engine without them.
    pub fn cpu_readiness(&self, py: Python<'_>) -> PyResult<Vec<CpuBuckets>> {
        let engine = self.engine.bind(py);
        if !self.cpu_runtimes || !engine.hasattr(intern!(py, "cpu_readiness"))? {
            return Ok(Vec::new());
        }
        let read: HashMap<String, HashMap<String, u32>> = engine
            .call_method0(intern!(py, "cpu_readiness"))?
            .extract()?;
        if let Some(name) = read.keys().find(|n| Mode::find(&self.modes, n).is_none()) {
            return Err(PyValueError::new_err(format!(
                "CPU runtime {name:?} is not a declared step mode (ModelInfo.step_modes)"
            )));
        }
        Ok(self
            .modes
            .iter()
            .filter_map(|&mode| {
                let states = read.get(mode.as_str())?;
                let counts = BucketState::ALL.map(|s| states.get(s.as_str()).copied().unwrap_or(0));
                Some(CpuBuckets {
                    runtime: mode,
                    counts,
                })
            })
            .collect())
    }

    /// `cpu_readiness` for an async task (a scrape, an `Info` call): the
    /// GIL is taken on a blocking thread, never on the reactor, since a
    /// step may hold it for its Python. Empty when it cannot be read.
    pub async fn cpu_readiness_off_reactor(self: &Arc<Self>) -> Vec<CpuBuckets> {
        if !self.cpu_runtimes {
            return Vec::new();
        }
        let engine = Arc::clone(self);
        let read =
            tokio::task::spawn_blocking(move || Python::attach(|py| engine.cpu_readiness(py)));
        match read.await {
            Ok(Ok(runtimes)) => runtimes,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "engine.cpu_readiness failed");
                Vec::new()
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading the CPU runtimes' readiness failed");
                Vec::new()
            }
        }
    }

    /// The step modes the engine declared, in its order.
    pub fn modes(&self) -> &[Mode] {
        &self.modes
    }

    pub fn info(&self, py: Python<'_>) -> PyResult<ModelInfo> {
        let info = self.engine.bind(py).getattr("info")?;
        let get = |name: &str| info.getattr(name);
        let kinds: Vec<String> = get("kinds")?.extract()?;
        let kinds = kinds
            .iter()
            .map(|k| {
                Kind::from_name(k).ok_or_else(|| {
                    PyValueError::new_err(format!("engine reports unknown kind {k:?}"))
                })
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok(ModelInfo {
            model_id: get("model_id")?.extract()?,
            architecture: get("architecture")?.extract()?,
            dimension: get("dimension")?.extract()?,
            max_input_length: get("max_input_length")?.extract()?,
            vocab_size: get("vocab_size")?.extract()?,
            pooling: get("pooling")?.extract()?,
            normalize_default: get("normalize_default")?.extract()?,
            kinds,
            token_states_dimension: optional_u32(&info, "token_states_dimension")?,
            multi_vector_dimension: get("multi_vector_dimension")?.extract()?,
            dtype: get("dtype")?.extract()?,
            device: get("device")?.extract()?,
            tokenizer_json: tokenizer_bytes(&optional(&info, "tokenizer_file")?)?,
            tokenizer_sha256: optional(&info, "tokenizer_sha256")?,
            prompts: info
                .getattr("prompts")
                .ok()
                .map(|p| p.extract())
                .transpose()?
                .unwrap_or_default(),
            default_prompt_name: optional(&info, "default_prompt_name")?,
            labels: info
                .getattr("labels")
                .ok()
                .map(|l| l.extract())
                .transpose()?
                .unwrap_or_default(),
            pair_template: optional(&info, "pair_template")?,
            span_pooling: optional(&info, "span_pooling")?,
            images: image_info(&info)?,
        })
    }

    /// Launches the batch: one Python call, which returns as soon as the
    /// engine has queued the work, with every field Tulip reads (each extra
    /// call or attribute read is Python on the step's critical path, run
    /// with cold caches after every wait for a request).
    pub fn step(&self, py: Python<'_>, batch: &HostBatch) -> Result<LazyOutput, TulipError> {
        let kind = batch.kind.unwrap_or(Kind::Dense);
        let result = (|| -> PyResult<LazyOutput> {
            let engine = self.engine.bind(py);
            let arena = PyByteArray::new(py, &batch.arena);
            let described = if kind == Kind::Image {
                let (dims, norm): (Vec<u32>, Vec<bool>) =
                    batch.image_options.iter().copied().unzip();
                engine.call_method1(
                    intern!(py, "step_images_arena"),
                    (arena, batch.sequences, dims, norm),
                )?
            } else {
                let args = (arena, batch.sequences, batch.tokens, kind.as_str());
                // Adapters only when the step has one: an engine without
                // adapters takes the four arguments it did.
                let args = match adapter_names(&batch.adapters) {
                    None => args.into_pyobject(py)?,
                    Some(names) => (args.0, args.1, args.2, args.3, names).into_pyobject(py)?,
                };
                engine.call_method1(intern!(py, "step_arena"), args)?
            };
            self.launched(py, described)
        })();
        result.map_err(|e| self.python_error(py, e))
    }

    /// A launched step's description (`LazyTensor.describe()` after the
    /// object): every field Tulip reads, in one tuple.
    fn launched(&self, py: Python<'_>, described: Bound<'_, PyAny>) -> PyResult<LazyOutput> {
        let (obj, ptr, rows, cols, event, mode, padded_tokens, capture_seconds): (
            Py<PyAny>,
            usize,
            usize,
            usize,
            usize,
            Bound<'_, PyString>,
            usize,
            f64,
        ) = described.extract()?;
        let name = mode.to_str()?;
        let Some(mode) = Mode::find(&self.modes, name) else {
            // An engine bug, a server fault like any engine exception:
            // the step's rows are lost, its buffers go back to the pool.
            obj.bind(py).call_method0(intern!(py, "release"))?;
            return Err(PyRuntimeError::new_err(format!(
                "the engine ran a step as {name:?}, a mode it did not declare ({})",
                self.modes
                    .iter()
                    .map(|m| m.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        Ok(LazyOutput {
            mode,
            padded_tokens,
            capture_seconds,
            ptr,
            rows,
            cols,
            event,
            obj,
        })
    }

    /// Loads a LoRA adapter (`engine.load_adapter(name, path)`), taking
    /// the GIL; every exception is the adapter's refusal, said as raised.
    pub fn load_adapter(&self, name: &str, path: &str) -> Result<Adapter, TulipError> {
        Python::attach(|py| {
            let engine = self.engine.bind(py);
            if !engine.hasattr("load_adapter").unwrap_or(false) {
                return Err(TulipError::Refused(
                    "this engine loads no LoRA adapters".into(),
                ));
            }
            let refused = |e: PyErr| TulipError::Refused(describe(py, &e));
            engine
                .call_method1(intern!(py, "load_adapter"), (name, path))
                .map_err(refused)?;
            let listed = self.adapters(py).map_err(refused)?.0;
            listed
                .into_iter()
                .find(|a| &*a.name == name)
                .ok_or_else(|| {
                    TulipError::Engine(format!(
                        "the engine does not list `{name}` after loading it"
                    ))
                })
        })
    }

    pub fn unload_adapter(&self, name: &str) -> Result<(), TulipError> {
        Python::attach(|py| {
            self.engine
                .bind(py)
                .call_method1(intern!(py, "unload_adapter"), (name,))
                .map(|_| ())
                .map_err(|e| TulipError::Engine(describe(py, &e)))
        })
    }

    /// The adapters loaded in the engine (`engine.adapters()`: records with
    /// name, path and rank), and its bounds (`info.max_adapters`,
    /// `info.max_adapter_rank`); none for an engine without adapters.
    pub fn adapters(&self, py: Python<'_>) -> PyResult<(Vec<Adapter>, u32, u32)> {
        let engine = self.engine.bind(py);
        if !engine.hasattr("adapters")? {
            return Ok((Vec::new(), 0, 0));
        }
        let mut out = Vec::new();
        for item in engine.call_method0("adapters")?.try_iter()? {
            let item = item?;
            out.push(Adapter {
                name: field(&item, "name")?.extract::<String>()?.into(),
                path: field(&item, "path")?.str()?.to_string(),
                rank: field(&item, "rank")?.extract()?,
            });
        }
        let info = engine.getattr("info")?;
        Ok((
            out,
            optional_u32(&info, "max_adapters")?,
            optional_u32(&info, "max_adapter_rank")?,
        ))
    }

    /// Hands a finished output's buffer back to the engine's pool.
    pub fn release(py: Python<'_>, lazy: LazyOutput) {
        if let Err(e) = lazy.obj.bind(py).call_method0(intern!(py, "release")) {
            tracing::error!(error = %e, "LazyTensor.release failed");
        }
        drop(lazy);
    }
}

/// Each sequence's adapter name (None for the base model) for the engine,
/// or None when the step has no adapter at all.
fn adapter_names(adapters: &[Option<std::sync::Arc<str>>]) -> Option<Vec<Option<&str>>> {
    (!adapters.is_empty()).then(|| adapters.iter().map(|a| a.as_deref()).collect())
}

/// A record's field: a dict's item or an object's attribute.
fn field<'py>(item: &Bound<'py, PyAny>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    item.get_item(name).or_else(|_| item.getattr(name))
}

/// An exception as "Type: message".
fn describe(py: Python<'_>, e: &PyErr) -> String {
    format!(
        "{}: {}",
        e.get_type(py)
            .name()
            .map(|n| n.to_string())
            .unwrap_or_default(),
        e.value(py)
    )
}

/// An optional string attribute of the engine's info ("" when missing or None).
fn optional(info: &Bound<'_, PyAny>, name: &str) -> PyResult<String> {
    match info.getattr(name) {
        Ok(v) if !v.is_none() => v.extract(),
        _ => Ok(String::new()),
    }
}

/// A count an engine may not report (test engines, older ROSE): 0.
fn optional_u32(info: &Bound<'_, PyAny>, name: &str) -> PyResult<u32> {
    match info.getattr(name) {
        Ok(v) if !v.is_none() => v.extract(),
        _ => Ok(0),
    }
}

/// An image model's inputs from the engine's info (zeros for text models).
fn image_info(info: &Bound<'_, PyAny>) -> PyResult<ImageInfo> {
    let tokens = optional_u32(info, "image_tokens")?;
    if tokens == 0 {
        return Ok(ImageInfo::default());
    }
    let (height, width): (u32, u32) = info.getattr("image_size")?.extract()?;
    let path = optional(info, "preprocessor_file")?;
    let preprocessor_config = if path.is_empty() {
        bytes::Bytes::new()
    } else {
        std::fs::read(&path).map(bytes::Bytes::from).map_err(|e| {
            PyValueError::new_err(format!(
                "cannot read the model's preprocessor config {path}: {e}"
            ))
        })?
    };
    Ok(ImageInfo {
        height,
        width,
        tokens,
        preprocessor_config,
        text_pad_to: optional_u32(info, "text_pad_to")?,
        pad_token_id: optional_u32(info, "pad_token_id")?,
    })
}

fn tokenizer_bytes(path: &str) -> PyResult<bytes::Bytes> {
    if path.is_empty() {
        return Ok(bytes::Bytes::new());
    }
    std::fs::read(path).map(bytes::Bytes::from).map_err(|e| {
        PyValueError::new_err(format!("cannot read the model's tokenizer {path}: {e}"))
    })
}

impl EngineHandle {
    /// Only the engine's invalid-batch error is the caller's fault; any
    /// other exception (a ValueError from a bug included) is a server fault,
    /// which Ivy retries on another replica.
    fn python_error(&self, py: Python<'_>, e: PyErr) -> TulipError {
        if e.is_instance(py, self.invalid_batch.bind(py)) {
            return TulipError::InvalidArgument(e.value(py).to_string());
        }
        TulipError::Engine(describe(py, &e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(b: &HostBatch) -> Vec<u32> {
        b.arena
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn arena_layout_matches_the_engine_contract() {
        let a: &[u32] = &[7, 8, 9];
        let b: &[u32] = &[5];
        let batch = HostBatch::build(Kind::Dense, [(a, 384, true), (b, 32, false)].into_iter());
        assert_eq!((batch.sequences, batch.tokens), (2, 4));
        let w = words(&batch);
        assert_eq!(&w[0..4], &[7, 8, 9, 5]); // ids
        assert_eq!(&w[4..8], &[0, 1, 2, 0]); // positions
        assert_eq!(&w[8..12], &[0, 0, 0, 1]); // seg_ids
        assert_eq!(&w[12..15], &[0, 3, 4]); // cu_seqlens
        assert_eq!(f32::from_bits(w[15]), 1.0 / 3.0);
        assert_eq!(f32::from_bits(w[16]), 1.0);
        assert_eq!(&w[17..19], &[384, 32]); // dims
        assert_eq!(&w[19..21], &[1, 0]); // normalize
        assert_eq!(w.len(), 21);
    }
}
