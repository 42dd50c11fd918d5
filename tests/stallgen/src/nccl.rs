//! NCCL, loaded at run time from libnccl.so.2 by its real symbol names, as PyTorch's
//! ProcessGroupNCCL reaches it. LD_LIBRARY_PATH decides whether that is a real NCCL or the
//! simulated one.
use std::ffi::{CStr, c_char, c_int, c_void};

use anyhow::{Context as _, Result, bail};
use libloading::Library;

use crate::cuda::{DevicePtr, Handle};

type NcclResult = c_int;

/// `ncclUniqueId`: 128 opaque bytes, passed by value to ncclCommInitRank.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; 128]);

const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;

/// Function pointers copied out of the library; valid while `_lib` stays loaded.
struct Api {
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> NcclResult,
    comm_init_rank: unsafe extern "C" fn(*mut Handle, c_int, UniqueId, c_int) -> NcclResult,
    comm_destroy: unsafe extern "C" fn(Handle) -> NcclResult,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        Handle,
        Handle,
    ) -> NcclResult,
    get_error_string: unsafe extern "C" fn(NcclResult) -> *const c_char,
}

pub struct Nccl {
    api: Api,
    _lib: Library,
}

/// A communicator of this rank.
pub struct Comm {
    handle: Handle,
}

/// Copies one function pointer out of `lib`.
///
/// # Safety
/// `F` must be the symbol's true C signature.
unsafe fn sym<F: Copy>(lib: &Library, name: &str) -> Result<F> {
    // SAFETY: the caller guarantees the type; the pointer is used only while `lib` lives.
    let s = unsafe { lib.get::<F>(name.as_bytes()) };
    Ok(*s.with_context(|| format!("libnccl.so.2 has no symbol {name}"))?)
}

impl Nccl {
    /// dlopen("libnccl.so.2") and resolve the entry points a data-parallel step uses.
    pub fn load() -> Result<Self> {
        // SAFETY: loading NCCL runs its initialisers, as every program using it does.
        let lib = unsafe { Library::new("libnccl.so.2") }.context(
            "cannot load libnccl.so.2 (for the simulated GPU, point LD_LIBRARY_PATH at the \
             directory simgpu_state::install_dir filled)",
        )?;
        // SAFETY: each type is the documented signature in nccl.h (2.x), with communicators
        // and streams as opaque pointers and ncclResult_t as int.
        let api = unsafe {
            Api {
                get_unique_id: sym(&lib, "ncclGetUniqueId")?,
                comm_init_rank: sym(&lib, "ncclCommInitRank")?,
                comm_destroy: sym(&lib, "ncclCommDestroy")?,
                all_reduce: sym(&lib, "ncclAllReduce")?,
                get_error_string: sym(&lib, "ncclGetErrorString")?,
            }
        };
        Ok(Self { api, _lib: lib })
    }

    fn check(&self, call: &str, r: NcclResult) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { CStr::from_ptr((self.api.get_error_string)(r)) };
        bail!("{call} failed: NCCL error {r} ({})", text.to_string_lossy())
    }

    pub fn unique_id(&self) -> Result<UniqueId> {
        let mut id = UniqueId([0; 128]);
        // SAFETY: a valid out-pointer.
        let r = unsafe { (self.api.get_unique_id)(&mut id) };
        self.check("ncclGetUniqueId", r)?;
        Ok(id)
    }

    /// Joins rank `rank` of `nranks` on the current CUDA context's GPU; returns once every
    /// rank has.
    pub fn init_rank(&self, nranks: usize, id: UniqueId, rank: usize) -> Result<Comm> {
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id travels by value, as in nccl.h.
        let r =
            unsafe { (self.api.comm_init_rank)(&mut handle, nranks as c_int, id, rank as c_int) };
        self.check("ncclCommInitRank", r)?;
        Ok(Comm { handle })
    }

    /// Queues an in-place sum all-reduce of `count` floats at `buf` on `stream`; returns as
    /// soon as it is queued.
    pub fn all_reduce(
        &self,
        comm: &Comm,
        buf: DevicePtr,
        count: usize,
        stream: Handle,
    ) -> Result<()> {
        let p = buf as usize as *mut c_void;
        // SAFETY: `buf` is a device allocation of at least `count` floats; NCCL only queues.
        let r = unsafe {
            (self.api.all_reduce)(p, p, count, NCCL_FLOAT32, NCCL_SUM, comm.handle, stream)
        };
        self.check("ncclAllReduce", r)
    }

    pub fn destroy(&self, comm: Comm) -> Result<()> {
        // SAFETY: a communicator from init_rank, destroyed once (it is consumed).
        let r = unsafe { (self.api.comm_destroy)(comm.handle) };
        self.check("ncclCommDestroy", r)
    }
}
