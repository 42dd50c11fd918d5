//! The CUDA driver API, loaded at run time from libcuda.so.1 by its real symbol names, as
//! PyTorch's libraries reach it. LD_LIBRARY_PATH decides whether that is the real driver or
//! the simulated GPU.
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use anyhow::{Context as _, Result, anyhow, bail};
use libloading::Library;

use crate::{ptx, sys};

type CuResult = c_int;
type CuDevice = c_int;
pub type Handle = *mut c_void;
pub type DevicePtr = u64;

const CUDA_SUCCESS: CuResult = 0;
/// `CU_STREAM_NON_BLOCKING`: the stream does not wait for the legacy default stream, as
/// PyTorch creates its NCCL streams.
const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `CU_EVENT_DISABLE_TIMING`: ordering only, as PyTorch's NCCL events.
const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;

/// `cuStreamWaitEvent(CUstream, CUevent, unsigned int flags)`.
type StreamWaitEvent = unsafe extern "C" fn(Handle, Handle, c_uint) -> CuResult;

/// Function pointers copied out of the library; valid while `_lib` stays loaded.
struct Api {
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    ctx_create: unsafe extern "C" fn(*mut Handle, c_uint, CuDevice) -> CuResult,
    module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> CuResult,
    module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut DevicePtr, usize) -> CuResult,
    mem_host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    memcpy_htod_async: unsafe extern "C" fn(DevicePtr, *const c_void, usize, Handle) -> CuResult,
    launch_kernel: LaunchKernel,
    /// The per-thread-default-stream twin, which frameworks built with
    /// `--default-stream per-thread` call: every other launch goes through it, so that the
    /// launch probes count more than one entry point, as on a real host.
    launch_kernel_ptsz: Option<LaunchKernel>,
    stream_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    stream_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(Handle) -> CuResult,
    event_create: unsafe extern "C" fn(*mut Handle, c_uint) -> CuResult,
    event_record: unsafe extern "C" fn(Handle, Handle) -> CuResult,
    event_destroy: unsafe extern "C" fn(Handle) -> CuResult,
    /// Only data-parallel runs order one stream after another's event; a simulator without it
    /// still runs everything else.
    stream_wait_event: Option<StreamWaitEvent>,
    memcpy_dtoh: unsafe extern "C" fn(*mut c_void, DevicePtr, usize) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, DevicePtr, usize, Handle) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
    /// Only for `--check-gpu`; absent from a driver (or simulator) is no error elsewhere.
    device_get_name: Option<unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult>,
}

/// The loaded driver library.
pub struct Driver {
    api: Api,
    /// Where the dynamic loader found libcuda.so.1.
    pub path: String,
    _lib: Library,
}

/// Copies one function pointer out of `lib`.
///
/// # Safety
/// `F` must be the symbol's true C signature.
unsafe fn sym<F: Copy>(lib: &Library, name: &str) -> Result<F> {
    // SAFETY: the caller guarantees the type; the pointer is used only while `lib` lives.
    let s = unsafe { lib.get::<F>(name.as_bytes()) };
    Ok(*s.with_context(|| format!("libcuda.so.1 has no symbol {name}"))?)
}

impl Driver {
    /// dlopen("libcuda.so.1") and resolve every entry point the job uses.
    pub fn load() -> Result<Self> {
        // SAFETY: loading libcuda runs its initialisers, which is what every CUDA program does.
        let lib = unsafe { Library::new("libcuda.so.1") }.context(
            "cannot load libcuda.so.1 (no NVIDIA driver here? for the simulated GPU, point \
             LD_LIBRARY_PATH at a directory that holds the simulator's libcuda.so.1)",
        )?;
        // SAFETY: each type below is the documented signature of the named driver entry point
        // (cuda.h, CUDA 12), with handles as opaque pointers and CUresult as int.
        let api = unsafe {
            Api {
                init: sym(&lib, "cuInit")?,
                device_get_count: sym(&lib, "cuDeviceGetCount")?,
                device_get: sym(&lib, "cuDeviceGet")?,
                ctx_create: sym(&lib, "cuCtxCreate_v2")?,
                module_load_data: sym(&lib, "cuModuleLoadData")?,
                module_get_function: sym(&lib, "cuModuleGetFunction")?,
                mem_alloc: sym(&lib, "cuMemAlloc_v2")?,
                mem_host_alloc: sym(&lib, "cuMemHostAlloc")?,
                memcpy_htod_async: sym(&lib, "cuMemcpyHtoDAsync_v2")?,
                launch_kernel: sym(&lib, "cuLaunchKernel")?,
                launch_kernel_ptsz: sym(&lib, "cuLaunchKernel_ptsz").ok(),
                stream_create: sym(&lib, "cuStreamCreate")?,
                stream_destroy: sym(&lib, "cuStreamDestroy_v2")?,
                stream_synchronize: sym(&lib, "cuStreamSynchronize")?,
                event_create: sym(&lib, "cuEventCreate")?,
                event_record: sym(&lib, "cuEventRecord")?,
                event_destroy: sym(&lib, "cuEventDestroy_v2")?,
                stream_wait_event: sym(&lib, "cuStreamWaitEvent").ok(),
                memcpy_dtoh: sym(&lib, "cuMemcpyDtoH_v2")?,
                memcpy_dtoh_async: sym(&lib, "cuMemcpyDtoHAsync_v2")?,
                get_error_string: sym(&lib, "cuGetErrorString")?,
                device_get_name: sym(&lib, "cuDeviceGetName").ok(),
            }
        };
        let path = sys::object_path(api.init as *const c_void)
            .unwrap_or_else(|| "libcuda.so.1 (path unknown)".to_owned());
        Ok(Self {
            api,
            path,
            _lib: lib,
        })
    }

    /// Turns a CUresult into an error that names the call and the driver's message.
    fn check(&self, call: &str, r: CuResult) -> Result<()> {
        if r == CUDA_SUCCESS {
            return Ok(());
        }
        let mut msg: *const c_char = std::ptr::null();
        // SAFETY: `msg` is a valid out-pointer; the driver stores a static string or nothing.
        let known = unsafe { (self.api.get_error_string)(r, &mut msg) } == CUDA_SUCCESS;
        let text = if known && !msg.is_null() {
            // SAFETY: cuGetErrorString returned a NUL-terminated static string.
            unsafe { CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned()
        } else {
            "unknown error".to_owned()
        };
        bail!("{call} failed: CUDA error {r} ({text})")
    }
}

type LaunchKernel = unsafe extern "C" fn(
    Handle,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Handle,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CuResult;

/// One context on the job's GPU with the job's stream, kernel and device buffer.
pub struct Gpu {
    drv: Driver,
    stream: Handle,
    spin: Handle,
    dbuf: DevicePtr,
    dbuf_bytes: usize,
    launches: std::sync::atomic::AtomicU64,
}

impl Gpu {
    /// cuInit, a context on GPU `ordinal`, the spin kernel, a stream and a `batch_bytes`
    /// buffer.
    pub fn init(drv: Driver, batch_bytes: usize, ordinal: usize) -> Result<Self> {
        let a = &drv.api;
        let mut count: c_int = 0;
        // SAFETY: a valid out-pointer; cuInit comes first, as the API requires.
        unsafe {
            drv.check("cuInit", (a.init)(0))?;
            drv.check("cuDeviceGetCount", (a.device_get_count)(&mut count))?;
        }
        if ordinal >= count as usize {
            bail!(
                "GPU {ordinal} is wanted but the machine has {count} (on the simulated GPU, set \
                 STALLSCOPE_SIMGPU_DEVICES before anything creates the state file)"
            );
        }
        let mut dev: CuDevice = 0;
        let (mut ctx, mut module, mut spin, mut stream): (Handle, Handle, Handle, Handle) = (
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
        let mut dbuf: DevicePtr = 0;
        // SAFETY: every out-pointer is a valid local; the PTX is NUL-terminated; the handles
        // passed in were returned by the calls before them (each result is checked first).
        unsafe {
            drv.check("cuDeviceGet", (a.device_get)(&mut dev, ordinal as c_int))?;
            drv.check("cuCtxCreate_v2", (a.ctx_create)(&mut ctx, 0, dev))?;
            let image = ptx::SPIN_PTX.as_ptr().cast();
            drv.check("cuModuleLoadData", (a.module_load_data)(&mut module, image))?;
            let name = ptx::SPIN_NAME.as_ptr();
            drv.check(
                "cuModuleGetFunction",
                (a.module_get_function)(&mut spin, module, name),
            )?;
            drv.check("cuStreamCreate", (a.stream_create)(&mut stream, 0))?;
            drv.check("cuMemAlloc_v2", (a.mem_alloc)(&mut dbuf, batch_bytes))?;
        }
        Ok(Self {
            drv,
            stream,
            spin,
            dbuf,
            dbuf_bytes: batch_bytes,
            launches: Default::default(),
        })
    }

    /// A device buffer of `bytes` (cuMemAlloc), e.g. the gradients a rank all-reduces.
    pub fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let mut p: DevicePtr = 0;
        // SAFETY: a valid out-pointer; the job's context is current on this thread.
        let r = unsafe { (self.drv.api.mem_alloc)(&mut p, bytes) };
        self.drv.check("cuMemAlloc_v2", r)?;
        Ok(p)
    }

    /// The job's stream: a data-parallel step's compute stream, which events are recorded on
    /// and made to wait.
    pub fn stream(&self) -> Handle {
        self.stream
    }

    /// Page-locked host memory (cuMemHostAlloc), as the pin-memory thread's buffers use.
    pub fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; flags 0 is a plain pinned allocation.
        let r = unsafe { (self.drv.api.mem_host_alloc)(&mut p, bytes, 0) };
        self.drv.check("cuMemHostAlloc", r)?;
        Ok(p.cast())
    }

    /// Queues the batch's copy to the device on the job's stream.
    ///
    /// # Safety
    /// `src` must be readable for `bytes` bytes; if it is pinned memory it must stay
    /// untouched until the next [`Gpu::sync_item`] (from pageable memory the driver stages
    /// the data before returning).
    pub unsafe fn copy_in(&self, src: *const u8, bytes: usize) -> Result<()> {
        let n = bytes.min(self.dbuf_bytes);
        let s = self.stream;
        // SAFETY: dbuf holds dbuf_bytes ≥ n; the caller vouches for `src`.
        let r = unsafe { (self.drv.api.memcpy_htod_async)(self.dbuf, src.cast(), n, s) };
        self.drv.check("cuMemcpyHtoDAsync_v2", r)
    }

    /// Launches the spin kernel for `ns` nanoseconds on one thread of one block.
    pub fn launch_spin(&self, ns: u64) -> Result<()> {
        let mut params = [(&raw const ns).cast_mut().cast::<c_void>()];
        let n = self
            .launches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (launch, name) = match self.drv.api.launch_kernel_ptsz {
            Some(ptsz) if n % 2 == 1 => (ptsz, "cuLaunchKernel_ptsz"),
            _ => (self.drv.api.launch_kernel, "cuLaunchKernel"),
        };
        // SAFETY: `params` holds one pointer to the kernel's only parameter, a u64; the driver
        // copies parameters during the call, so the locals may die afterwards.
        let r = unsafe {
            launch(
                self.spin,
                1,
                1,
                1,
                1,
                1,
                1,
                0,
                self.stream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        self.drv.check(name, r)
    }

    /// `loss.item()`: wait for the stream (spinning on-CPU by default), then read 4 bytes.
    pub fn sync_item(&self) -> Result<u32> {
        // SAFETY: the stream is ours and alive.
        let r = unsafe { (self.drv.api.stream_synchronize)(self.stream) };
        self.drv.check("cuStreamSynchronize", r)?;
        let mut loss = 0u32;
        let dst = (&raw mut loss).cast::<c_void>();
        // SAFETY: `dst` is valid for 4 bytes and dbuf holds at least 4096.
        let r = unsafe { (self.drv.api.memcpy_dtoh)(dst, self.dbuf, 4) };
        self.drv.check("cuMemcpyDtoH_v2", r)?;
        Ok(loss)
    }

    /// A second stream (cuStreamCreate with CU_STREAM_NON_BLOCKING), as ProcessGroupNCCL
    /// keeps one per device for its collectives.
    pub fn stream_create_nonblocking(&self) -> Result<Handle> {
        let mut s: Handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the job's context is current on this thread.
        let r = unsafe { (self.drv.api.stream_create)(&mut s, CU_STREAM_NON_BLOCKING) };
        self.drv.check("cuStreamCreate", r)?;
        Ok(s)
    }

    /// A stream from [`Gpu::stream_create_nonblocking`], once its work is done.
    pub fn stream_destroy(&self, stream: Handle) -> Result<()> {
        // SAFETY: a stream this context created, destroyed once by the caller.
        let r = unsafe { (self.drv.api.stream_destroy)(stream) };
        self.drv.check("cuStreamDestroy_v2", r)
    }

    /// An event for ordering streams (cuEventCreate with CU_EVENT_DISABLE_TIMING).
    pub fn event_create(&self) -> Result<Handle> {
        let mut e: Handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the job's context is current on this thread.
        let r = unsafe { (self.drv.api.event_create)(&mut e, CU_EVENT_DISABLE_TIMING) };
        self.drv.check("cuEventCreate", r)?;
        Ok(e)
    }

    pub fn event_destroy(&self, event: Handle) -> Result<()> {
        // SAFETY: an event from `event_create`, destroyed once by the caller.
        let r = unsafe { (self.drv.api.event_destroy)(event) };
        self.drv.check("cuEventDestroy_v2", r)
    }

    /// Records `event` on `stream`: it is reached once the work queued there so far is done.
    pub fn event_record(&self, event: Handle, stream: Handle) -> Result<()> {
        // SAFETY: an event and a stream of this context, both alive.
        let r = unsafe { (self.drv.api.event_record)(event, stream) };
        self.drv.check("cuEventRecord", r)
    }

    /// Makes the work queued on `stream` from now on wait for `event`'s last record; the host
    /// does not wait.
    pub fn stream_wait_event(&self, stream: Handle, event: Handle) -> Result<()> {
        let f = self.stream_wait_event_fn()?;
        // SAFETY: a stream and an event of this context, both alive; flags must be 0.
        let r = unsafe { f(stream, event, 0) };
        self.drv.check("cuStreamWaitEvent", r)
    }

    /// Fails unless the driver can order one stream after another's event, which a
    /// data-parallel step needs: said before the ranks join, not mid-step.
    pub fn require_stream_wait_event(&self) -> Result<()> {
        self.stream_wait_event_fn().map(|_| ())
    }

    fn stream_wait_event_fn(&self) -> Result<StreamWaitEvent> {
        self.drv.api.stream_wait_event.ok_or_else(|| {
            anyhow!(
                "libcuda.so.1 has no symbol cuStreamWaitEvent, which data-parallel runs need (a \
                 simulated GPU built before it had one?)"
            )
        })
    }

    /// Queues a copy of `bytes` at `src` to `dst` on the job's stream (cuMemcpyDtoHAsync_v2).
    ///
    /// # Safety
    /// `src` must be a device allocation of at least `bytes`, and `dst` writable for `bytes`
    /// until the stream has synchronised; if `dst` is pageable the driver waits for the copy
    /// in the call.
    pub unsafe fn copy_out_async(&self, dst: *mut u8, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: forwarded caller contract.
        let r = unsafe { (self.drv.api.memcpy_dtoh_async)(dst.cast(), src, bytes, self.stream) };
        self.drv.check("cuMemcpyDtoHAsync_v2", r)
    }

    /// Waits for the job's stream (cuStreamSynchronize, spinning on-CPU by default).
    pub fn sync(&self) -> Result<()> {
        // SAFETY: the stream is ours and alive.
        let r = unsafe { (self.drv.api.stream_synchronize)(self.stream) };
        self.drv.check("cuStreamSynchronize", r)
    }

    /// The name of device 0, or why it is unknown.
    pub fn device_name(&self) -> Result<String> {
        let Some(f) = self.drv.api.device_get_name else {
            bail!("libcuda.so.1 has no symbol cuDeviceGetName");
        };
        let mut buf = [0 as c_char; 256];
        // SAFETY: `buf` has room for the 256 bytes passed; device 0 was opened in `init`.
        let r = unsafe { f(buf.as_mut_ptr(), buf.len() as c_int, 0) };
        self.drv.check("cuDeviceGetName", r)?;
        buf[255] = 0;
        // SAFETY: the buffer is NUL-terminated (its last byte at the latest).
        let name = unsafe { CStr::from_ptr(buf.as_ptr()) };
        Ok(name.to_string_lossy().into_owned())
    }
}
