//! The CUDA driver, loaded at run time: Tulip builds and runs on machines
//! with no CUDA at all, and on a GPU machine binds to the driver that torch
//! already loaded. `query` answers whether a CUDA event has completed;
//! `event.rs` waits on it.
//!
//! A `cudaEvent_t` from the runtime API is the driver's `CUevent`, and the
//! driver library exists once per process, so events torch records can be
//! queried from any thread, once that thread has a context: a thread that
//! never touched CUDA (Tulip's completion thread, a fresh Python thread) gets
//! the bound device's primary context (the one torch uses) made current on
//! first use, and its capture mode relaxed so an event query can never
//! invalidate a graph another thread is capturing.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::OnceLock;

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

/// Why an event could not be queried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryError {
    /// No driver, a missing symbol, no context.
    Unavailable(String),
    /// The driver reported an error for the event (or for the set-up).
    Cuda {
        call: &'static str,
        code: i32,
        name: String,
    },
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

fn driver() -> Result<&'static Driver, QueryError> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER
        .get_or_init(load)
        .as_ref()
        .map_err(|e| QueryError::Unavailable(e.clone()))
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

fn check(d: &Driver, call: &'static str, code: CuResult) -> Result<(), QueryError> {
    if code == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(QueryError::Cuda {
            call,
            code,
            name: name(d, code),
        })
    }
}

/// Once per thread: the bound device's primary context made current when
/// the thread has none, and the thread's capture mode relaxed.
fn prepare_thread(d: &Driver) -> Result<(), QueryError> {
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

/// Whether the CUDA event has completed, without blocking. `event` is a
/// raw `cudaEvent_t` the caller keeps alive until this returns.
pub fn query(event: usize) -> Result<bool, QueryError> {
    let d = driver()?;
    prepare_thread(d)?;
    // SAFETY: the event handle comes from a live torch.cuda.Event that the
    // caller keeps alive until this returns.
    match unsafe { (d.query)(event as *mut c_void) } {
        CUDA_SUCCESS => Ok(true),
        CUDA_ERROR_NOT_READY => Ok(false),
        rc => Err(QueryError::Cuda {
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
    fn device_ordinals() {
        assert_eq!(ordinal("cuda"), Some(0));
        assert_eq!(ordinal("cuda:3"), Some(3));
        assert_eq!(ordinal("cpu"), None);
        assert_eq!(ordinal("cuda:x"), None);
    }

    #[test]
    fn sticky_codes() {
        assert!(is_sticky(700) && is_sticky(719) && is_sticky(999));
        assert!(!is_sticky(400) && !is_sticky(2));
    }
}
