//! The one kernel stallgen launches: a single thread that spins on %globaltimer for as many
//! nanoseconds as its only parameter says, so the GPU counts as busy for exactly that long.

/// The kernel's name in [`SPIN_PTX`].
pub const SPIN_NAME: &std::ffi::CStr = c"spin";

/// PTX for `spin(u64 duration_ns)` (`tests/stallgen/spin.ptx`, which the Python jobs load
/// too), NUL-terminated for cuModuleLoadData. sm_70 and PTX 7.0
/// JIT-compile on every GPU a current driver supports. The simulated GPU reads the same
/// first parameter as the kernel's duration, so the job runs unchanged on both.
pub const SPIN_PTX: &std::ffi::CStr = match std::ffi::CStr::from_bytes_with_nul(
    concat!(include_str!("../spin.ptx"), "\0").as_bytes(),
) {
    Ok(ptx) => ptx,
    Err(_) => panic!("spin.ptx holds a NUL byte"),
};
