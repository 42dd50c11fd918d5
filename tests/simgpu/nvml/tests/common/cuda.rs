//! The simulated libcuda.so.1 loaded with libloading, as a workload would dlopen the real one,
//! behind a small safe wrapper that panics with the failing call's name.
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::path::Path;

use libloading::Library;

/// An opaque CUDA handle (context, stream, event, module, function).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handle(pub *mut c_void);

impl Handle {
    /// The NULL (legacy default) stream.
    pub const DEFAULT_STREAM: Handle = Handle(std::ptr::null_mut());
}

/// stallgen's PTX kernel: spins for `ns` nanoseconds of %globaltimer.
pub const SPIN_PTX: &str = "\
.version 7.0
.target sm_70
.address_size 64

.visible .entry spin(
    .param .u64 spin_param_0
)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [spin_param_0];
    mov.u64 %rd2, %globaltimer;
    add.s64 %rd3, %rd2, %rd1;
$L_spin:
    mov.u64 %rd4, %globaltimer;
    setp.lt.u64 %p1, %rd4, %rd3;
    @%p1 bra $L_spin;
    ret;
}
\0";

type P = *mut c_void;
/// `CUhostFn`.
type HostFn = unsafe extern "C" fn(P);

macro_rules! driver_api {
    ($($name:ident: ($($arg:ty),*);)*) => {
        #[expect(non_snake_case, reason = "the C names of the driver functions")]
        struct Api {
            $($name: unsafe extern "C" fn($($arg),*) -> u32,)*
        }

        impl Api {
            fn load(lib: &Library) -> Api {
                Api {
                    $($name: {
                        let name = concat!(stringify!($name), "\0");
                        // SAFETY: the symbol is typed with its cuda.h signature.
                        let sym = unsafe { lib.get(name.as_bytes()) };
                        *sym.unwrap_or_else(|e| panic!("libcuda.so.1 lacks {}: {e}", stringify!($name)))
                    },)*
                }
            }
        }
    };
}

driver_api! {
    cuInit: (c_uint);
    cuDeviceGetCount: (*mut c_int);
    cuDeviceGet: (*mut c_int, c_int);
    cuCtxCreate_v2: (*mut P, c_uint, c_int);
    cuCtxGetDevice: (*mut c_int);
    cuCtxDestroy_v2: (P);
    cuCtxSynchronize: ();
    cuMemAlloc_v2: (*mut u64, usize);
    cuMemFree_v2: (u64);
    cuMemHostAlloc: (*mut P, usize, c_uint);
    cuMemFreeHost: (P);
    cuMemcpyHtoD_v2: (u64, *const c_void, usize);
    cuMemcpyHtoDAsync_v2: (u64, *const c_void, usize, P);
    cuMemcpyDtoH_v2: (P, u64, usize);
    cuModuleLoadData: (*mut P, *const c_void);
    cuModuleGetFunction: (*mut P, P, *const c_char);
    cuLaunchKernel: (P, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, P, *mut P, *mut P);
    cuStreamCreate: (*mut P, c_uint);
    cuStreamSynchronize: (P);
    cuStreamQuery: (P);
    cuStreamWaitEvent: (P, P, c_uint);
    simgpuLaunchCommKernel: (P, Option<HostFn>, P, u64, c_uint);
    cuEventCreate: (*mut P, c_uint);
    cuEventRecord: (P, P);
    cuEventSynchronize: (P);
    cuEventElapsedTime: (*mut f32, P, P);
}

/// The loaded driver.
pub struct Cuda {
    api: Api,
    _lib: Library,
}

fn check(code: u32, call: &str) {
    assert_eq!(code, 0, "{call} returned CUresult {code}");
}

impl Cuda {
    /// dlopens `lib_dir/libcuda.so.1` and calls cuInit.
    pub fn load(lib_dir: &Path) -> Cuda {
        let path = lib_dir.join("libcuda.so.1");
        // SAFETY: loading our own library runs no initializers with preconditions.
        let lib = unsafe { Library::new(&path) }
            .unwrap_or_else(|e| panic!("dlopen {}: {e}", path.display()));
        let cuda = Cuda {
            api: Api::load(&lib),
            _lib: lib,
        };
        // SAFETY: cuInit takes flags by value.
        check(unsafe { (cuda.api.cuInit)(0) }, "cuInit");
        cuda
    }

    /// Creates a context on device 0 and makes it current.
    pub fn ctx_create(&self) -> Handle {
        self.ctx_create_on(0)
    }

    /// Creates a context on GPU `ordinal` (looked up with cuDeviceGet) and makes it current.
    pub fn ctx_create_on(&self, ordinal: c_int) -> Handle {
        let (mut dev, mut ctx) = (-1, std::ptr::null_mut());
        // SAFETY: valid out-pointers.
        unsafe {
            check((self.api.cuDeviceGet)(&mut dev, ordinal), "cuDeviceGet");
            check(
                (self.api.cuCtxCreate_v2)(&mut ctx, 0, dev),
                "cuCtxCreate_v2",
            );
        }
        Handle(ctx)
    }

    /// cuDeviceGetCount.
    pub fn device_count(&self) -> c_int {
        let mut n = -1;
        // SAFETY: a valid out-pointer.
        check(
            unsafe { (self.api.cuDeviceGetCount)(&mut n) },
            "cuDeviceGetCount",
        );
        n
    }

    /// cuDeviceGet's CUresult for `ordinal`.
    pub fn device_get_code(&self, ordinal: c_int) -> u32 {
        let mut dev = -1;
        // SAFETY: a valid out-pointer.
        unsafe { (self.api.cuDeviceGet)(&mut dev, ordinal) }
    }

    /// The GPU of the current context.
    pub fn ctx_device(&self) -> c_int {
        let mut dev = -1;
        // SAFETY: a valid out-pointer.
        check(
            unsafe { (self.api.cuCtxGetDevice)(&mut dev) },
            "cuCtxGetDevice",
        );
        dev
    }

    pub fn ctx_destroy(&self, ctx: Handle) {
        // SAFETY: a context handle from ctx_create.
        check(
            unsafe { (self.api.cuCtxDestroy_v2)(ctx.0) },
            "cuCtxDestroy_v2",
        );
    }

    pub fn ctx_sync(&self) {
        // SAFETY: no arguments.
        check(unsafe { (self.api.cuCtxSynchronize)() }, "cuCtxSynchronize");
    }

    pub fn mem_alloc(&self, bytes: usize) -> u64 {
        let mut dptr = 0;
        // SAFETY: a valid out-pointer.
        check(
            unsafe { (self.api.cuMemAlloc_v2)(&mut dptr, bytes) },
            "cuMemAlloc_v2",
        );
        dptr
    }

    pub fn mem_free(&self, dptr: u64) {
        // SAFETY: a device pointer from mem_alloc.
        check(unsafe { (self.api.cuMemFree_v2)(dptr) }, "cuMemFree_v2");
    }

    /// Page-locked host memory of `bytes` bytes.
    pub fn host_alloc(&self, bytes: usize) -> *mut u8 {
        let mut p = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check(
            unsafe { (self.api.cuMemHostAlloc)(&mut p, bytes, 0) },
            "cuMemHostAlloc",
        );
        p.cast()
    }

    pub fn free_host(&self, p: *mut u8) {
        // SAFETY: a pointer from host_alloc whose copies have completed (cuMemFreeHost syncs).
        check(
            unsafe { (self.api.cuMemFreeHost)(p.cast()) },
            "cuMemFreeHost",
        );
    }

    /// Synchronous host-to-device copy.
    pub fn htod(&self, dptr: u64, src: &[u8]) {
        // SAFETY: `src` is readable for its length; the call returns after the copy.
        let code = unsafe { (self.api.cuMemcpyHtoD_v2)(dptr, src.as_ptr().cast(), src.len()) };
        check(code, "cuMemcpyHtoD_v2");
    }

    /// Asynchronous host-to-device copy.
    ///
    /// # Safety
    /// `src` must stay valid for `len` bytes until the stream has been synchronized.
    pub unsafe fn htod_async(&self, dptr: u64, src: *const u8, len: usize, stream: Handle) {
        // SAFETY: per this function's contract.
        let code = unsafe { (self.api.cuMemcpyHtoDAsync_v2)(dptr, src.cast(), len, stream.0) };
        check(code, "cuMemcpyHtoDAsync_v2");
    }

    /// Synchronous device-to-host copy.
    pub fn dtoh(&self, dst: &mut [u8], dptr: u64) {
        // SAFETY: `dst` is writable for its length; the call returns after the copy.
        let code = unsafe { (self.api.cuMemcpyDtoH_v2)(dst.as_mut_ptr().cast(), dptr, dst.len()) };
        check(code, "cuMemcpyDtoH_v2");
    }

    /// Loads [`SPIN_PTX`] and returns its `spin` function.
    pub fn spin_function(&self) -> Handle {
        let (mut module, mut function) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a NUL-terminated PTX image and valid out-pointers.
        unsafe {
            check(
                (self.api.cuModuleLoadData)(&mut module, SPIN_PTX.as_ptr().cast()),
                "cuModuleLoadData",
            );
            check(
                (self.api.cuModuleGetFunction)(&mut function, module, c"spin".as_ptr()),
                "cuModuleGetFunction",
            );
        }
        Handle(function)
    }

    /// Launches `spin(ns)` on `stream` with one block of 32 threads.
    pub fn launch_spin(&self, spin: Handle, ns: u64, stream: Handle) {
        let mut ns = ns;
        let mut params = [(&raw mut ns).cast::<c_void>()];
        // SAFETY: one parameter pointer for spin's one u64 parameter; read during the call.
        let code = unsafe {
            (self.api.cuLaunchKernel)(
                spin.0,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream.0,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check(code, "cuLaunchKernel");
    }

    pub fn stream_create(&self) -> Handle {
        let mut s = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check(
            unsafe { (self.api.cuStreamCreate)(&mut s, 0) },
            "cuStreamCreate",
        );
        Handle(s)
    }

    pub fn stream_sync(&self, stream: Handle) {
        // SAFETY: a stream handle (or NULL).
        check(
            unsafe { (self.api.cuStreamSynchronize)(stream.0) },
            "cuStreamSynchronize",
        );
    }

    /// cuStreamQuery's CUresult (0 when done, 600 CUDA_ERROR_NOT_READY while work is pending).
    pub fn stream_query(&self, stream: Handle) -> u32 {
        // SAFETY: a stream handle (or NULL).
        unsafe { (self.api.cuStreamQuery)(stream.0) }
    }

    /// Makes later work of `stream` wait for `event`.
    pub fn stream_wait_event(&self, stream: Handle, event: Handle) {
        // SAFETY: handles from this driver; flags 0.
        check(
            unsafe { (self.api.cuStreamWaitEvent)(stream.0, event.0, 0) },
            "cuStreamWaitEvent",
        );
    }

    /// The simulated driver's comm kernel (what the NCCL stand-in queues), here without a
    /// wait: `ns` of comm-lane kernel keeping `sm_share_pct` percent of the SMs active.
    pub fn launch_comm(&self, ns: u64, sm_share_pct: u32, stream: Handle) {
        // SAFETY: no wait function, so the data pointer is never used.
        let code = unsafe {
            (self.api.simgpuLaunchCommKernel)(
                stream.0,
                None,
                std::ptr::null_mut(),
                ns,
                sm_share_pct,
            )
        };
        check(code, "simgpuLaunchCommKernel");
    }

    pub fn event_create(&self) -> Handle {
        let mut e = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        check(
            unsafe { (self.api.cuEventCreate)(&mut e, 0) },
            "cuEventCreate",
        );
        Handle(e)
    }

    pub fn event_record(&self, event: Handle, stream: Handle) {
        // SAFETY: handles from this driver.
        check(
            unsafe { (self.api.cuEventRecord)(event.0, stream.0) },
            "cuEventRecord",
        );
    }

    pub fn event_sync(&self, event: Handle) {
        // SAFETY: an event handle.
        check(
            unsafe { (self.api.cuEventSynchronize)(event.0) },
            "cuEventSynchronize",
        );
    }

    /// Milliseconds between two completed events.
    pub fn elapsed_ms(&self, start: Handle, end: Handle) -> f32 {
        let mut ms = 0.0;
        // SAFETY: a valid out-pointer and event handles.
        let code = unsafe { (self.api.cuEventElapsedTime)(&mut ms, start.0, end.0) };
        check(code, "cuEventElapsedTime");
        ms
    }
}
