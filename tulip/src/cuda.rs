//! Waiting on CUDA events without the GIL, through the CUDA driver loaded at
//! run time: Tulip builds and runs on machines with no CUDA at all, and on
//! a GPU machine binds to the driver that torch already loaded.
//!
//! A `cudaEvent_t` from the runtime API is the driver's `CUevent`, and the
//! driver library exists once per process, so events torch records can be
//! waited on from any thread.

use std::ffi::c_void;
use std::sync::OnceLock;

type CuResult = i32;
type EventFn = unsafe extern "C" fn(*mut c_void) -> CuResult;

const CUDA_SUCCESS: CuResult = 0;
const CUDA_ERROR_NOT_READY: CuResult = 600;

struct Driver {
    synchronize: EventFn,
    query: EventFn,
    // Keeps the symbols valid.
    _lib: libloading::Library,
}

fn driver() -> Result<&'static Driver, String> {
    static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
    DRIVER.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Driver, String> {
    // SAFETY: libcuda's initialisers are safe to run; torch has normally
    // loaded it already, in which case this only takes a reference.
    unsafe {
        let lib = libloading::Library::new("libcuda.so.1")
            .map_err(|e| format!("CUDA driver (libcuda.so.1) not available: {e}"))?;
        let synchronize = *lib
            .get::<EventFn>(b"cuEventSynchronize\0")
            .map_err(|e| format!("cuEventSynchronize: {e}"))?;
        let query = *lib
            .get::<EventFn>(b"cuEventQuery\0")
            .map_err(|e| format!("cuEventQuery: {e}"))?;
        Ok(Driver {
            synchronize,
            query,
            _lib: lib,
        })
    }
}

/// Blocks until the event has completed. `event == 0` means "no event".
pub fn wait(event: usize) -> Result<(), String> {
    if event == 0 {
        return Ok(());
    }
    let d = driver()?;
    // SAFETY: the event handle comes from a live torch.cuda.Event that the
    // caller keeps alive until this returns.
    let rc = unsafe { (d.synchronize)(event as *mut c_void) };
    if rc == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("cuEventSynchronize failed with CUDA error {rc}"))
    }
}

/// Whether the event has completed, without blocking.
pub fn is_complete(event: usize) -> Result<bool, String> {
    if event == 0 {
        return Ok(true);
    }
    let d = driver()?;
    // SAFETY: as in `wait`.
    match unsafe { (d.query)(event as *mut c_void) } {
        CUDA_SUCCESS => Ok(true),
        CUDA_ERROR_NOT_READY => Ok(false),
        rc => Err(format!("cuEventQuery failed with CUDA error {rc}")),
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
}
