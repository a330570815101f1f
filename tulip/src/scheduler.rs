//! The scheduler thread: attaches to Python only around `step()` (and to
//! release finished outputs). It launches a batch as soon as one is waiting
//! and fewer than `max_inflight` steps are running, so batch N+1 is built
//! and launched while batch N is still on the device.
//!
//! `launch` is also how a gRPC task runs a lone request inline when the
//! engine was idle (see `queue::Submitted::Inline`): that task holds its I/O
//! thread for one small step while the runtime's other threads serve I/O.

use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::time::Instant;

use pyo3::Python;

use crate::completion;
use crate::engine::{keep_thread_state, EngineHandle, HostBatch, LazyOutput};
use crate::error::TulipError;
use crate::metrics::{ClassLabel, Metrics, ModeLabel};
use crate::model::Kind;
use crate::priority::Class;
use crate::queue::{InFlight, Pool, SeqRef, Work};

/// Where a launched step's rows are read.
pub enum Delivery<'a> {
    /// On the launching thread (an inline request waits for its own rows).
    Here,
    /// On the completion thread, so the scheduler can launch the next batch.
    Completion(&'a Sender<InFlight>),
}

pub fn run(
    pool: Arc<Pool>,
    engine: Arc<EngineHandle>,
    done: Sender<InFlight>,
    metrics: Arc<Metrics>,
) {
    keep_thread_state();
    loop {
        match pool.next_work() {
            Work::Batch(seqs, releases) => launch(
                &pool,
                &engine,
                Delivery::Completion(&done),
                &metrics,
                seqs,
                releases,
            ),
            Work::Release(releases) => Python::attach(|py| release_all(py, releases)),
            Work::Stop(releases) => {
                // Python references are dropped deterministically, with the GIL.
                Python::attach(|py| {
                    release_all(py, releases);
                    drop(engine);
                });
                return;
            }
        }
    }
}

/// Runs one batch that holds a step slot: builds it, calls `step()` under
/// the GIL, and has its rows delivered; the slot is freed on every path.
pub fn launch(
    pool: &Pool,
    engine: &EngineHandle,
    delivery: Delivery<'_>,
    metrics: &Metrics,
    seqs: Vec<SeqRef>,
    releases: Vec<LazyOutput>,
) {
    let batch = host_batch(&seqs);
    let launched = Instant::now();
    for s in &seqs {
        let mut p = s.request.lock();
        p.first_launch.get_or_insert(launched);
        p.last_scheduled = Some(launched);
    }
    keep_thread_state();
    let result = Python::attach(|py| {
        release_all(py, releases);
        engine.step(py, &batch)
    });
    match result {
        Ok(output) => {
            pool.on_device(&seqs, launched);
            // A CPU step has run by now: all of it was the device's time.
            let on_device = if output.event == 0 {
                launched
            } else {
                Instant::now()
            };
            metrics.inflight_steps.set(pool.inflight() as i64);
            metrics.queued_sequences.set(pool.queued_sequences() as i64);
            record_step(metrics, &seqs, &output);
            let step = InFlight {
                seqs,
                output,
                launched,
                on_device,
            };
            match delivery {
                // Already on the host (CPU), or an inline request: a hop to
                // the completion thread would only add a thread wake-up.
                Delivery::Here => completion::complete(pool, step, metrics),
                Delivery::Completion(_) if step.output.event == 0 => {
                    completion::complete(pool, step, metrics)
                }
                Delivery::Completion(done) => {
                    if let Err(unsent) = done.send(step) {
                        // The completion thread is gone (shutdown): fail and free.
                        let step = unsent.0;
                        fail(&step.seqs, "server is shutting down");
                        pool.finish_step(
                            &step.seqs,
                            Some(step.output),
                            Some((step.on_device, false)),
                        );
                    }
                }
            }
        }
        Err(e) => {
            if let TulipError::Engine(msg) = &e {
                tracing::error!(requests = %request_ids(&seqs), error = %msg, "engine step failed");
            }
            metrics.inflight_steps.set(pool.inflight() as i64);
            metrics.queued_sequences.set(pool.queued_sequences() as i64);
            for s in &seqs {
                s.request.fail(e.clone());
            }
            pool.finish_step(&seqs, None, None);
        }
    }
}

/// The distinct request ids of a batch, for a log line (the first few).
fn request_ids(seqs: &[SeqRef]) -> String {
    const SHOWN: usize = 8;
    let mut ids: Vec<&str> = Vec::new();
    for s in seqs {
        let id = s.request.request_id.as_str();
        if ids.last() != Some(&id) {
            ids.push(id);
        }
    }
    let more = ids.len().saturating_sub(SHOWN);
    let mut out = ids[..ids.len().min(SHOWN)].join(",");
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

fn record_step(metrics: &Metrics, seqs: &[SeqRef], output: &LazyOutput) {
    let tokens: usize = seqs.iter().map(SeqRef::len).sum();
    metrics.batch_tokens.observe(tokens as f64);
    metrics.batch_sequences.observe(seqs.len() as f64);
    metrics.tokens.inc_by(tokens as u64);
    let mut by_class = [0u64; 2];
    for s in seqs {
        by_class[(s.request.class == Class::Batch) as usize] += s.len() as u64;
    }
    for (class, n) in [
        (Class::Interactive, by_class[0]),
        (Class::Batch, by_class[1]),
    ] {
        if n > 0 {
            let label = ClassLabel { class };
            metrics.class_steps.get_or_create(&label).inc();
            metrics.class_tokens.get_or_create(&label).inc_by(n);
        }
    }
    metrics
        .padded_tokens
        .inc_by(output.padded_tokens.saturating_sub(tokens) as u64);
    metrics
        .steps
        .get_or_create(&ModeLabel { mode: output.mode })
        .inc();
    if output.mode.is_capture() {
        metrics.graphs_captured.inc();
        metrics.capture_seconds.observe(output.capture_seconds);
    }
}

fn fail(seqs: &[SeqRef], why: &str) {
    for s in seqs {
        s.request
            .fail(crate::error::TulipError::Unavailable(why.to_string()));
    }
}

fn release_all(py: Python<'_>, releases: Vec<LazyOutput>) {
    for r in releases {
        EngineHandle::release(py, r);
    }
}

/// The batch in the engine's arena layout. Ids were checked against the
/// vocabulary, so they fit in int32.
fn host_batch(seqs: &[SeqRef]) -> HostBatch {
    let kind = seqs.first().map_or(Kind::Dense, |s| s.request.kind);
    if kind == Kind::Image {
        return HostBatch::images(
            seqs.iter().map(|s| {
                let r = &s.request;
                (r.image(s.index), r.dimensions, r.normalize)
            }),
            seqs.first().map_or(0, SeqRef::len),
        );
    }
    let mut batch = HostBatch::build(
        kind,
        seqs.iter().map(|s| {
            (
                s.request.sequence(s.index),
                s.request.dimensions,
                s.request.normalize,
            )
        }),
    );
    if seqs.iter().any(|s| s.request.adapter.is_some()) {
        batch.adapters = seqs
            .iter()
            .map(|s| s.request.adapter.as_ref().map(|a| Arc::clone(&a.name)))
            .collect();
    }
    batch
}
