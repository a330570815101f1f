//! The completion thread: waits on each launched step without the GIL, reads
//! its rows straight from the host buffer, and hands every sequence's rows to
//! its request, answering requests whose last sequence arrived.

use std::sync::mpsc::Receiver;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use proto::tulip::v1::Timing;

use crate::error::TulipError;
use crate::event;
use crate::metrics::Metrics;
use crate::output::{rows_for, Accumulator};
use crate::queue::{InFlight, Pool, SeqRef};

pub fn run(pool: Arc<Pool>, steps: Receiver<InFlight>, metrics: Arc<Metrics>) {
    // Steps complete in launch order (one stream), so waiting in order is
    // never slower than waiting on whichever finishes first.
    for step in steps {
        complete(&pool, step, &metrics);
    }
}

/// Delivers a step's rows (waiting for them first) and frees its slot; the
/// output goes back to the scheduler thread for release under the GIL.
pub fn complete(pool: &Pool, step: InFlight, metrics: &Metrics) {
    let waited = event::wait(step.output.event);
    let delivered = match &waited {
        Ok(()) => deliver(&step),
        Err(e) => Err(TulipError::Engine(e.to_string())),
    };
    if let Err(e) = delivered {
        let ids: Vec<&str> = step
            .seqs
            .iter()
            .map(|s| s.request.request_id.as_str())
            .collect();
        tracing::error!(requests = %ids.join(","), error = %e, "step output unusable");
        for s in &step.seqs {
            s.request.fail(e.clone());
        }
    }
    if let Err(e) = &waited {
        if e.is_fatal() {
            device_failed(&e.to_string());
        }
    }
    metrics
        .step_seconds
        .observe(step.launched.elapsed().as_secs_f64());
    let ran = Some((step.on_device, waited.is_ok()));
    pool.finish_step(&step.seqs, Some(step.output), ran);
    metrics.inflight_steps.set(pool.inflight() as i64);
}

/// What a replica does when its device is unusable for good, instead of
/// the default (log, then exit so the gateway and the orchestrator see it
/// gone): set once, before serving (e.g. health to NOT_SERVING, then exit).
pub type DeviceFailureHook = Box<dyn Fn(&str) + Send + Sync>;

static DEVICE_FAILURE: OnceLock<DeviceFailureHook> = OnceLock::new();

/// Exit status of a replica stopped by a device failure (EX_SOFTWARE).
pub const EXIT_DEVICE_FAILURE: i32 = 70;

/// Installs the device-failure hook; false if one was installed already.
#[allow(dead_code)] // for the server's start-up, which keeps the default today
pub fn on_device_failure(hook: DeviceFailureHook) -> bool {
    DEVICE_FAILURE.set(hook).is_ok()
}

/// A sticky CUDA error or a hung step: every later step would fail fast, and
/// a replica that fails fast looks least loaded to the gateway, so it must
/// stop answering SERVING rather than keep failing.
fn device_failed(reason: &str) {
    if let Some(hook) = DEVICE_FAILURE.get() {
        return hook(reason);
    }
    tracing::error!(
        reason,
        "device failure: the CUDA context is unusable; exiting"
    );
    // Leaves a moment for the failed requests' answers to be written.
    std::thread::sleep(Duration::from_millis(200));
    std::process::exit(EXIT_DEVICE_FAILURE);
}

/// Hands a completed step's rows to their requests.
fn deliver(step: &InFlight) -> Result<(), TulipError> {
    let kind = match step.seqs.first() {
        Some(s) => s.request.kind,
        None => return Ok(()),
    };
    let expected: usize = step.seqs.iter().map(|s| rows_for(kind, s.len())).sum();
    if expected != step.output.rows {
        return Err(TulipError::Engine(format!(
            "engine returned {} rows for a batch that needs {expected}",
            step.output.rows
        )));
    }
    // SAFETY: the event completed above, and the output is released only
    // after this function returns.
    let data = unsafe { step.output.data() };
    let cols = step.output.cols;
    let mut row = 0;
    for s in &step.seqs {
        let n = rows_for(kind, s.len());
        put(s, &data[row * cols..(row + n) * cols], cols);
        row += n;
    }
    Ok(())
}

fn put(seq: &SeqRef, rows: &[f32], cols: usize) {
    let req = &seq.request;
    let mut p = req.lock();
    if p.reply.is_none() {
        return; // already failed or answered
    }
    p.output.put(
        seq.index,
        rows,
        cols,
        req.sequence(seq.index),
        req.raw_scores,
    );
    p.remaining -= 1;
    if p.remaining > 0 {
        return;
    }
    let now = Instant::now();
    let output = std::mem::replace(
        &mut p.output,
        Accumulator::Sparse {
            per_seq: Vec::new(),
        },
    );
    let mut resp = output.finish(req.kind, req.num_sequences());
    resp.tokens = req.tokens() as u64;
    let micros = |from: Option<Instant>, to: Instant| {
        from.map_or(0, |f| to.saturating_duration_since(f).as_micros() as u64)
    };
    resp.timing = Some(Timing {
        queue_us: micros(Some(req.arrived), p.last_scheduled.unwrap_or(now)),
        inference_us: micros(p.first_launch, now),
        total_us: micros(Some(req.arrived), now),
    });
    if let Some(reply) = p.reply.take() {
        let _ = reply.send(Ok(resp));
    }
}
