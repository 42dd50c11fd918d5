//! A process that loads the CUDA driver library late, the way PyTorch dlopens libcuda.so.1
//! on first use, then keeps calling probed driver functions.
use std::{
    ffi::{CString, c_void},
    io::{self, Write as _},
    time::{Duration, Instant},
};

type Sync0 = unsafe extern "C" fn() -> i32;

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
type Init = unsafe extern "C" fn(u32) -> i32;

fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown dlopen error".into()
    } else {
        // SAFETY: non-null, NUL-terminated, valid until the next dl call on this thread.
        unsafe { std::ffi::CStr::from_ptr(e) }
            .to_string_lossy()
            .into_owned()
    }
}

fn sym(lib: *mut c_void, name: &str) -> io::Result<*mut c_void> {
    let c = CString::new(name).map_err(io::Error::other)?;
    // SAFETY: a handle from dlopen and a NUL-terminated name.
    let p = unsafe { libc::dlsym(lib, c.as_ptr()) };
    if p.is_null() {
        return Err(io::Error::other(format!("{name}: {}", dlerror())));
    }
    Ok(p)
}

fn open(lib: &str) -> io::Result<*mut c_void> {
    let name = CString::new(lib).map_err(io::Error::other)?;
    // SAFETY: a NUL-terminated library name.
    let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        return Err(io::Error::other(format!("dlopen {lib}: {}", dlerror())));
    }
    Ok(handle)
}

/// Announces readiness, waits `delay`, dlopens `preload` (only mapped) and `lib` (names the
/// dynamic linker resolves, e.g. through LD_LIBRARY_PATH, or paths), then calls `lib`'s
/// cuCtxSynchronize in 10 ms steps until `secs`. Each call's time (CLOCK_MONOTONIC) goes to
/// stdout as `call ns=T`, the ground truth of what the probes should see.
pub fn cuda_late(
    lib: &str,
    preload: Option<&str>,
    delay: Duration,
    secs: Duration,
) -> io::Result<()> {
    let start = Instant::now();
    crate::announce_ready()?;
    std::thread::sleep(delay);
    if let Some(p) = preload {
        open(p)?;
    }
    let handle = open(lib)?;
    // SAFETY: the driver API's signatures.
    let init: Init = unsafe { std::mem::transmute(sym(handle, "cuInit")?) };
    // SAFETY: as above.
    let sync: Sync0 = unsafe { std::mem::transmute(sym(handle, "cuCtxSynchronize")?) };
    // SAFETY: plain driver calls; without a context the sync fails, which is fine: the call
    // is what the probes must see.
    unsafe { init(0) };
    let mut out = io::stdout().lock();
    while start.elapsed() < secs {
        // SAFETY: as above.
        unsafe { sync() };
        writeln!(out, "call ns={}", monotonic_ns())?;
        std::thread::sleep(Duration::from_millis(10));
    }
    out.flush()?;
    Ok(())
}

type EventRecord = unsafe extern "C" fn(*mut c_void, *mut c_void) -> i32;

/// Announces readiness, dlopens `lib` and calls its cuEventRecord `per_sec` times a second
/// (paced every millisecond) until `secs`, as code that records an event after every kernel
/// does; prints `events n=N` at the end. Without an event the call fails, which is fine: the
/// call is what the probes see.
pub fn cuda_events(lib: &str, per_sec: u64, secs: Duration) -> io::Result<()> {
    crate::announce_ready()?;
    let handle = open(lib)?;
    // SAFETY: the driver API's signatures.
    let init: Init = unsafe { std::mem::transmute(sym(handle, "cuInit")?) };
    // SAFETY: as above.
    let record: EventRecord = unsafe { std::mem::transmute(sym(handle, "cuEventRecord")?) };
    // SAFETY: a plain driver call.
    unsafe { init(0) };
    let start = Instant::now();
    let mut done = 0u64;
    while start.elapsed() < secs {
        let due = (start.elapsed().as_nanos() * u128::from(per_sec) / 1_000_000_000) as u64;
        while done < due {
            // SAFETY: null handles are refused by the driver, not dereferenced.
            unsafe { record(std::ptr::null_mut(), std::ptr::null_mut()) };
            done += 1;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut out = io::stdout().lock();
    writeln!(out, "events n={done}")?;
    out.flush()
}
