//! Waiting on CUDA events without the GIL, through the CUDA driver loaded at
//! run time: Tulip builds and runs on machines with no CUDA at all, and on
//! a GPU machine binds to the driver that torch already loaded.
//!
//! A `cudaEvent_t` from the runtime API is the driver's `CUevent`, and the
//! driver library exists once per process, so events torch records can be
//! waited on from any thread, once that thread has a context: a thread that
//! never touched CUDA (Tulip's completion thread, a fresh Python thread) gets
//! the bound device's primary context (the one torch uses) made current on
//! first use, and its capture mode relaxed so an event query can never
//! invalidate a graph another thread is capturing.
//!
//! Waits are bounded: the event is queried in a loop, then polled with a
//! back-off, until a deadline, so a hung kernel turns into an error instead
//! of a thread that never returns. Errors name the CUDA code (`CUDA_ERROR_ILLEGAL_ADDRESS`),
//! and [`WaitError::is_fatal`] says when the context is unusable for good.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::sim_event;

type CuResult = i32;
type EventFn = unsafe extern "C" fn(*mut c_void) -> CuResult;
type ErrorNameFn = unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult;
type CtxGetCurrentFn = unsafe extern "C" fn(*mut *mut c_void) -> CuResult;
type CtxSetCurrentFn = unsafe extern "C" fn(*mut c_void) -> CuResult;
type PrimaryRetainFn = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult;
type DeviceGetFn = unsafe extern "C" fn(*mut c_int, c_int) -> CuResult;
type ExchangeModeFn = unsafe extern "C" fn(*mut c_int) -> CuResult;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_NOT_READY: CuResult = 600;
/// `CU_STREAM_CAPTURE_MODE_RELAXED`.
const CAPTURE_MODE_RELAXED: c_int = 2;

/// How long one wait may take before it is reported as a hang, unless
/// `TULIP_EVENT_TIMEOUT_S` says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// For this long a wait queries in a loop (yielding the core between
/// queries): a step of a few milliseconds is seen within microseconds, as
/// fast as a blocking synchronize would wake up. Longer steps are then
/// polled with a back-off, capped so that the extra latency stays a small
/// fraction of a step that long and the thread costs little CPU.
const SPIN: Duration = Duration::from_millis(20);
const FIRST_POLL: Duration = Duration::from_micros(10);
const MAX_POLL: Duration = Duration::from_micros(200);

/// Why a wait did not end with a completed event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitError {
    /// No driver, a missing symbol, no context: nothing was waited on.
    Unavailable(String),
    /// The event did not complete within the deadline (a hung kernel).
    Timeout(Duration),
    /// The driver reported an error for the event.
    Cuda {
        call: &'static str,
        code: i32,
        name: String,
    },
}

impl WaitError {
    /// The process's CUDA context cannot be used any more: a sticky
    /// (asynchronous kernel) error, or a step that never finished. Every
    /// later step would fail too, so the replica must stop serving.
    pub fn is_fatal(&self) -> bool {
        match self {
            WaitError::Unavailable(_) => false,
            WaitError::Timeout(_) => true,
            WaitError::Cuda { code, .. } => is_sticky(*code),
        }
    }
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitError::Unavailable(m) => f.write_str(m),
            WaitError::Timeout(d) => {
                write!(f, "CUDA event not complete after {:.1}s", d.as_secs_f64())
            }
            WaitError::Cuda { call, code, name } => write!(f, "{call} failed: {name} ({code})"),
        }
    }
}

/// Codes after which the context is corrupted (the CUDA documentation's
/// "the process must be terminated" errors): illegal address, launch
/// failure, assert, illegal instruction, misaligned address, invalid
/// address space, invalid PC, hardware stack error, uncorrectable ECC,
/// launch timeout; and CUDA_ERROR_UNKNOWN, which a lost device reports.
pub fn is_sticky(code: i32) -> bool {
    matches!(code, 214 | 700 | 702 | 710 | 714..=719 | 999)
}

struct Driver {
    query: EventFn,
    error_name: Option<ErrorNameFn>,
    ctx_get_current: CtxGetCurrentFn,
    ctx_set_current: CtxSetCurrentFn,
    primary_retain: PrimaryRetainFn,
    device_get: DeviceGetFn,
    exchange_mode: Option<ExchangeModeFn>,
    // Keeps the symbols valid.
    _lib: libloading::Library,
}

fn driver() -> Result<&'static Driver, WaitError> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(load)
        .as_ref()
        .map_err(|e| WaitError::Unavailable(e.clone()))
}

fn load() -> Result<Driver, String> {
    // SAFETY: libcuda's initialisers are safe to run; torch has normally
    // loaded it already, in which case this only takes a reference. The
    // symbol types match the driver API's C signatures.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1")
            .map_err(|e| format!("CUDA driver (libcuda.so.1) not available: {e}"))?;
        macro_rules! sym {
            ($t:ty, $name:literal) => {
                *lib.get::<$t>(concat!($name, "\0").as_bytes())
                    .map_err(|e| format!("{}: {e}", $name))?
            };
        }
        macro_rules! optional {
            ($t:ty, $name:literal) => {
                lib.get::<$t>(concat!($name, "\0").as_bytes())
                    .ok()
                    .map(|s| *s)
            };
        }
        Ok(Driver {
            query: sym!(EventFn, "cuEventQuery"),
            error_name: optional!(ErrorNameFn, "cuGetErrorName"),
            ctx_get_current: sym!(CtxGetCurrentFn, "cuCtxGetCurrent"),
            ctx_set_current: sym!(CtxSetCurrentFn, "cuCtxSetCurrent"),
            primary_retain: sym!(PrimaryRetainFn, "cuDevicePrimaryCtxRetain"),
            device_get: sym!(DeviceGetFn, "cuDeviceGet"),
            exchange_mode: optional!(ExchangeModeFn, "cuThreadExchangeStreamCaptureMode"),
            _lib: lib,
        })
    }
}

static DEVICE: AtomicI32 = AtomicI32::new(0);

/// The device whose primary context threads without one are given: call
/// once with the engine's device (`"cuda:1"` → 1) before serving. Events
/// of that device are then waitable from any thread.
pub fn bind_device(ordinal: i32) {
    DEVICE.store(ordinal, Ordering::Relaxed);
}

/// The ordinal of a torch device string: `cuda:N` → N, `cuda` → 0, `None`
/// for anything that is not a CUDA device.
pub fn ordinal(device: &str) -> Option<i32> {
    match device.split_once(':') {
        None if device == "cuda" => Some(0),
        Some(("cuda", n)) => n.parse().ok(),
        _ => None,
    }
}

fn name(d: &Driver, code: CuResult) -> String {
    let Some(f) = d.error_name else {
        return "CUDA error".into();
    };
    let mut s: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or fails.
    if unsafe { f(code, &mut s) } != CUDA_SUCCESS || s.is_null() {
        return "unknown CUDA error".into();
    }
    // SAFETY: as above, a static NUL-terminated string.
    unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
}

fn check(d: &Driver, call: &'static str, code: CuResult) -> Result<(), WaitError> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(WaitError::Cuda {
            call,
            code,
            name: name(d, code),
        })
    }
}

/// Once per thread: the bound device's primary context made current when
/// the thread has none, and the thread's capture mode relaxed.
fn prepare_thread(d: &Driver) -> Result<(), WaitError> {
    thread_local!(static READY: Cell<bool> = const { Cell::new(false) });
    if READY.with(Cell::get) {
        return Ok(());
    }
    let mut ctx: *mut c_void = std::ptr::null_mut();
    // SAFETY: out-pointers to locals; the driver API's documented use.
    unsafe {
        check(d, "cuCtxGetCurrent", (d.ctx_get_current)(&mut ctx))?;
        if ctx.is_null() {
            let mut dev: c_int = 0;
            check(
                d,
                "cuDeviceGet",
                (d.device_get)(&mut dev, DEVICE.load(Ordering::Relaxed)),
            )?;
            check(
                d,
                "cuDevicePrimaryCtxRetain",
                (d.primary_retain)(&mut ctx, dev),
            )?;
            check(d, "cuCtxSetCurrent", (d.ctx_set_current)(ctx))?;
        }
        if let Some(exchange) = d.exchange_mode {
            let mut mode = CAPTURE_MODE_RELAXED;
            check(d, "cuThreadExchangeStreamCaptureMode", exchange(&mut mode))?;
        }
    }
    READY.with(|r| r.set(true));
    Ok(())
}

/// The wait deadline: `TULIP_EVENT_TIMEOUT_S` seconds, else two minutes.
pub fn default_timeout() -> Duration {
    static T: OnceLock<Duration> = OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("TULIP_EVENT_TIMEOUT_S")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .map_or(DEFAULT_TIMEOUT, Duration::from_secs_f64)
    })
}

/// Blocks until the event has completed, at most [`default_timeout`].
/// `event == 0` means "no event".
pub fn wait(event: usize) -> Result<(), WaitError> {
    wait_for(event, default_timeout())
}

/// Blocks until the event has completed or `timeout` has passed. A
/// simulated device's event (a tagged handle, never a valid pointer) is
/// waited on by `sim_event`, with the same results and errors.
pub fn wait_for(event: usize, timeout: Duration) -> Result<(), WaitError> {
    if event == 0 {
        return Ok(());
    }
    if sim_event::is_sim(event) {
        return sim_event::wait_for(event, timeout);
    }
    let d = driver()?;
    prepare_thread(d)?;
    let start = Instant::now();
    let mut pause = FIRST_POLL;
    loop {
        // SAFETY: the event handle comes from a live torch.cuda.Event that
        // the caller keeps alive until this returns.
        match unsafe { (d.query)(event as *mut c_void) } {
            CUDA_SUCCESS => return Ok(()),
            CUDA_ERROR_NOT_READY => {}
            rc => {
                return Err(WaitError::Cuda {
                    call: "cuEventQuery",
                    code: rc,
                    name: name(d, rc),
                })
            }
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(WaitError::Timeout(waited));
        }
        if waited < SPIN {
            std::thread::yield_now();
            continue;
        }
        std::thread::sleep(pause.min(timeout - waited));
        pause = (pause * 2).min(MAX_POLL);
    }
}

/// Whether the event has completed, without blocking.
pub fn is_complete(event: usize) -> Result<bool, WaitError> {
    if event == 0 {
        return Ok(true);
    }
    if sim_event::is_sim(event) {
        return sim_event::is_complete(event);
    }
    let d = driver()?;
    prepare_thread(d)?;
    // SAFETY: as in `wait_for`.
    match unsafe { (d.query)(event as *mut c_void) } {
        CUDA_SUCCESS => Ok(true),
        CUDA_ERROR_NOT_READY => Ok(false),
        rc => Err(WaitError::Cuda {
            call: "cuEventQuery",
            code: rc,
            name: name(d, rc),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_event_is_complete() {
        assert!(wait(0).is_ok());
        assert_eq!(is_complete(0), Ok(true));
    }

    #[test]
    fn device_ordinals() {
        assert_eq!(ordinal("cuda"), Some(0));
        assert_eq!(ordinal("cuda:3"), Some(3));
        assert_eq!(ordinal("cpu"), None);
        assert_eq!(ordinal("cuda:x"), None);
    }

    #[test]
    fn sticky_errors_are_fatal_and_others_not() {
        let illegal = WaitError::Cuda {
            call: "cuEventQuery",
            code: 700,
            name: "CUDA_ERROR_ILLEGAL_ADDRESS".into(),
        };
        assert!(illegal.is_fatal());
        assert!(WaitError::Timeout(Duration::from_secs(1)).is_fatal());
        let invalid = WaitError::Cuda {
            call: "cuEventQuery",
            code: 400,
            name: "CUDA_ERROR_INVALID_HANDLE".into(),
        };
        assert!(!invalid.is_fatal());
        assert!(!WaitError::Unavailable("no driver".into()).is_fatal());
        assert_eq!(
            illegal.to_string(),
            "cuEventQuery failed: CUDA_ERROR_ILLEGAL_ADDRESS (700)"
        );
    }

    #[test]
    fn a_missing_driver_is_reported_not_fatal() {
        // CI machines have no libcuda: a real event cannot be waited on,
        // and the error says why instead of panicking.
        if driver().is_err() {
            // (An aligned value: odd ones are simulated events, sim_event.rs.)
            let e = wait(8).unwrap_err();
            assert!(matches!(e, WaitError::Unavailable(_)), "{e}");
            assert!(e.to_string().contains("libcuda"), "{e}");
        }
    }
}
