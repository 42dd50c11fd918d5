//! The simulated libcuda.so.1 and libnccl.so.2, loaded the way a framework loads them (dlopen,
//! symbols by their C names), behind a small wrapper that panics with the failing call's name.
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::path::Path;

use libloading::Library;

type P = *mut c_void;

/// `ncclUniqueId`, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; 128]);

pub const FLOAT32: c_int = 7;
pub const SUM: c_int = 0;

/// The spin kernel the driver times by its first parameter.
const SPIN_PTX: &CStr = c".version 7.0
.target sm_70
.address_size 64
.visible .entry spin(.param .u64 ns)
{
  ret;
}
";

#[expect(non_snake_case, reason = "the C names")]
pub struct Api {
    pub cuInit: unsafe extern "C" fn(c_uint) -> u32,
    pub cuDeviceGetCount: unsafe extern "C" fn(*mut c_int) -> u32,
    pub cuCtxCreate_v2: unsafe extern "C" fn(*mut P, c_uint, c_int) -> u32,
    pub cuStreamCreate: unsafe extern "C" fn(*mut P, c_uint) -> u32,
    pub cuStreamSynchronize: unsafe extern "C" fn(P) -> u32,
    pub cuStreamWaitEvent: unsafe extern "C" fn(P, P, c_uint) -> u32,
    pub cuEventCreate: unsafe extern "C" fn(*mut P, c_uint) -> u32,
    pub cuEventRecord: unsafe extern "C" fn(P, P) -> u32,
    pub cuEventElapsedTime: unsafe extern "C" fn(*mut f32, P, P) -> u32,
    pub cuMemAlloc_v2: unsafe extern "C" fn(*mut u64, usize) -> u32,
    pub cuModuleLoadData: unsafe extern "C" fn(*mut P, *const c_void) -> u32,
    pub cuModuleGetFunction: unsafe extern "C" fn(*mut P, P, *const c_char) -> u32,
    pub cuLaunchKernel: unsafe extern "C" fn(
        P,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        P,
        *mut P,
        *mut P,
    ) -> u32,
    pub ncclGetVersion: unsafe extern "C" fn(*mut c_int) -> c_int,
    pub ncclGetUniqueId: unsafe extern "C" fn(*mut UniqueId) -> c_int,
    pub ncclCommInitRank: unsafe extern "C" fn(*mut P, c_int, UniqueId, c_int) -> c_int,
    pub ncclCommDestroy: unsafe extern "C" fn(P) -> c_int,
    pub ncclCommCount: unsafe extern "C" fn(P, *mut c_int) -> c_int,
    pub ncclCommUserRank: unsafe extern "C" fn(P, *mut c_int) -> c_int,
    pub ncclAllReduce: unsafe extern "C" fn(*const c_void, P, usize, c_int, c_int, P, P) -> c_int,
    pub ncclAllGather: unsafe extern "C" fn(*const c_void, P, usize, c_int, P, P) -> c_int,
    pub ncclBroadcast: unsafe extern "C" fn(*const c_void, P, usize, c_int, c_int, P, P) -> c_int,
    pub ncclSend: unsafe extern "C" fn(*const c_void, usize, c_int, c_int, P, P) -> c_int,
    pub ncclRecv: unsafe extern "C" fn(P, usize, c_int, c_int, P, P) -> c_int,
    pub ncclGroupStart: unsafe extern "C" fn() -> c_int,
    pub ncclGroupEnd: unsafe extern "C" fn() -> c_int,
    pub ncclGetErrorString: unsafe extern "C" fn(c_int) -> *const c_char,
    _cuda: Library,
    _nccl: Library,
}

/// `*lib.get(name)`, typed by the field it fills.
macro_rules! sym {
    ($lib:expr, $name:literal) => {{
        // SAFETY: the field's type is the symbol's C signature.
        let s = unsafe { $lib.get(concat!($name, "\0").as_bytes()) };
        *s.unwrap_or_else(|e| panic!("missing {}: {e}", $name))
    }};
}

impl Api {
    /// dlopens `lib_dir/libcuda.so.1` and `lib_dir/libnccl.so.2`.
    pub fn load(lib_dir: &Path) -> Api {
        // SAFETY: our own libraries; their initializers have no preconditions.
        let (cuda, nccl) = unsafe {
            (
                Library::new(lib_dir.join("libcuda.so.1")).expect("dlopen libcuda.so.1"),
                Library::new(lib_dir.join("libnccl.so.2")).expect("dlopen libnccl.so.2"),
            )
        };
        Api {
            cuInit: sym!(cuda, "cuInit"),
            cuDeviceGetCount: sym!(cuda, "cuDeviceGetCount"),
            cuCtxCreate_v2: sym!(cuda, "cuCtxCreate_v2"),
            cuStreamCreate: sym!(cuda, "cuStreamCreate"),
            cuStreamSynchronize: sym!(cuda, "cuStreamSynchronize"),
            cuStreamWaitEvent: sym!(cuda, "cuStreamWaitEvent"),
            cuEventCreate: sym!(cuda, "cuEventCreate"),
            cuEventRecord: sym!(cuda, "cuEventRecord"),
            cuEventElapsedTime: sym!(cuda, "cuEventElapsedTime"),
            cuMemAlloc_v2: sym!(cuda, "cuMemAlloc_v2"),
            cuModuleLoadData: sym!(cuda, "cuModuleLoadData"),
            cuModuleGetFunction: sym!(cuda, "cuModuleGetFunction"),
            cuLaunchKernel: sym!(cuda, "cuLaunchKernel"),
            ncclGetVersion: sym!(nccl, "ncclGetVersion"),
            ncclGetUniqueId: sym!(nccl, "ncclGetUniqueId"),
            ncclCommInitRank: sym!(nccl, "ncclCommInitRank"),
            ncclCommDestroy: sym!(nccl, "ncclCommDestroy"),
            ncclCommCount: sym!(nccl, "ncclCommCount"),
            ncclCommUserRank: sym!(nccl, "ncclCommUserRank"),
            ncclAllReduce: sym!(nccl, "ncclAllReduce"),
            ncclAllGather: sym!(nccl, "ncclAllGather"),
            ncclBroadcast: sym!(nccl, "ncclBroadcast"),
            ncclSend: sym!(nccl, "ncclSend"),
            ncclRecv: sym!(nccl, "ncclRecv"),
            ncclGroupStart: sym!(nccl, "ncclGroupStart"),
            ncclGroupEnd: sym!(nccl, "ncclGroupEnd"),
            ncclGetErrorString: sym!(nccl, "ncclGetErrorString"),
            _cuda: cuda,
            _nccl: nccl,
        }
    }

    pub fn unique_id(&self) -> UniqueId {
        let mut id = UniqueId([0; 128]);
        // SAFETY: a valid out-pointer.
        nccl_ok(
            unsafe { (self.ncclGetUniqueId)(&mut id) },
            "ncclGetUniqueId",
        );
        id
    }
}

pub fn cu_ok(code: u32, call: &str) {
    assert_eq!(code, 0, "{call} returned CUresult {code}");
}

pub fn nccl_ok(code: c_int, call: &str) {
    assert_eq!(code, 0, "{call} returned ncclResult_t {code}");
}

/// A rank's GPU side: a context on its device, a stream, a buffer and the spin kernel.
pub struct Rank<'a> {
    pub api: &'a Api,
    pub stream: P,
    pub buf: u64,
    spin: P,
}

impl<'a> Rank<'a> {
    /// cuInit and a context on GPU `device`, current on this thread.
    pub fn open(api: &'a Api, device: c_int, buf_bytes: usize) -> Self {
        let (mut ctx, mut stream, mut module, mut spin) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let mut buf = 0;
        // SAFETY: valid out-pointers, a NUL-terminated PTX image and a NUL-terminated name.
        unsafe {
            cu_ok((api.cuInit)(0), "cuInit");
            let mut count = 0;
            cu_ok((api.cuDeviceGetCount)(&mut count), "cuDeviceGetCount");
            assert!(device < count, "GPU {device} of {count}");
            cu_ok((api.cuCtxCreate_v2)(&mut ctx, 0, device), "cuCtxCreate_v2");
            cu_ok((api.cuStreamCreate)(&mut stream, 0), "cuStreamCreate");
            cu_ok((api.cuMemAlloc_v2)(&mut buf, buf_bytes), "cuMemAlloc_v2");
            cu_ok(
                (api.cuModuleLoadData)(&mut module, SPIN_PTX.as_ptr().cast()),
                "cuModuleLoadData",
            );
            cu_ok(
                (api.cuModuleGetFunction)(&mut spin, module, c"spin".as_ptr()),
                "cuModuleGetFunction",
            );
        }
        Rank {
            api,
            stream,
            buf,
            spin,
        }
    }

    /// ncclCommInitRank.
    pub fn comm(&self, nranks: c_int, id: UniqueId, rank: c_int) -> P {
        let mut comm = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id travels by value.
        let rc = unsafe { (self.api.ncclCommInitRank)(&mut comm, nranks, id, rank) };
        nccl_ok(rc, "ncclCommInitRank");
        comm
    }

    /// A kernel of `ns` nanoseconds on the stream.
    pub fn kernel(&self, ns: u64) {
        self.kernel_on(ns, self.stream);
    }

    /// Another stream of the rank's context (a framework's NCCL stream).
    pub fn new_stream(&self) -> P {
        let mut stream = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.api.cuStreamCreate)(&mut stream, 0) };
        cu_ok(rc, "cuStreamCreate");
        stream
    }

    /// An event recorded on `stream` now.
    pub fn record(&self, stream: P) -> P {
        let mut event = std::ptr::null_mut();
        // SAFETY: a valid out-pointer, then our event and stream.
        unsafe {
            cu_ok((self.api.cuEventCreate)(&mut event, 0), "cuEventCreate");
            cu_ok((self.api.cuEventRecord)(event, stream), "cuEventRecord");
        }
        event
    }

    /// Microseconds from event `start` to event `end`, both complete.
    pub fn elapsed_us(&self, start: P, end: P) -> u64 {
        let mut ms = 0f32;
        // SAFETY: a valid out-pointer and our events.
        let rc = unsafe { (self.api.cuEventElapsedTime)(&mut ms, start, end) };
        cu_ok(rc, "cuEventElapsedTime");
        (f64::from(ms) * 1e3).round() as u64
    }

    /// Later work of `stream` waits for `event` (cuStreamWaitEvent).
    pub fn wait_event(&self, stream: P, event: P) {
        // SAFETY: our stream and event; flags 0.
        let rc = unsafe { (self.api.cuStreamWaitEvent)(stream, event, 0) };
        cu_ok(rc, "cuStreamWaitEvent");
    }

    /// A kernel of `ns` nanoseconds on `stream`.
    pub fn kernel_on(&self, ns: u64, stream: P) {
        let mut ns = ns;
        let mut params = [(&raw mut ns).cast::<c_void>()];
        // SAFETY: one parameter pointer for the kernel's one u64 parameter.
        let rc = unsafe {
            (self.api.cuLaunchKernel)(
                self.spin,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        cu_ok(rc, "cuLaunchKernel");
    }

    /// An all-reduce of `count` floats of the buffer, in place.
    pub fn all_reduce(&self, comm: P, count: usize) {
        self.all_reduce_on(comm, count, self.stream);
    }

    /// An all-reduce of `count` floats of the buffer, in place, on `stream`.
    pub fn all_reduce_on(&self, comm: P, count: usize, stream: P) {
        let b = self.buf as usize as P;
        // SAFETY: device pointers of our buffer, which holds `count` floats.
        let rc = unsafe { (self.api.ncclAllReduce)(b, b, count, FLOAT32, SUM, comm, stream) };
        nccl_ok(rc, "ncclAllReduce");
    }

    pub fn sync(&self) {
        // SAFETY: our stream.
        cu_ok(
            unsafe { (self.api.cuStreamSynchronize)(self.stream) },
            "cuStreamSynchronize",
        );
    }
}
