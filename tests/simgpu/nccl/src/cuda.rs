//! The CUDA driver entry points a communicator needs, resolved in the libcuda.so.1 the process
//! already uses (the simulated one), so that NCCL's work goes through the exported symbols as
//! the real library's does. One of them is not CUDA's: `simgpuLaunchCommKernel`, the simulated
//! driver's kernel that waits for the peers while it occupies the GPU (real NCCL waits inside
//! its kernel, and host code cannot run in a simulated kernel any other way).
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

pub type CUresult = c_int;
pub type Handle = *mut c_void;
pub type HostFn = unsafe extern "C" fn(*mut c_void);
/// The simulated driver's `simgpuLaunchCommKernel(stream, wait, data, transfer_ns,
/// sm_share_pct)`: a comm-lane kernel that calls `wait(data)` and then spins `transfer_ns`.
pub type CommKernelFn =
    unsafe extern "C" fn(Handle, Option<HostFn>, *mut c_void, u64, c_uint) -> CUresult;

pub struct Cuda {
    pub ctx_get_current: unsafe extern "C" fn(*mut Handle) -> CUresult,
    pub module_load_data: unsafe extern "C" fn(*mut Handle, *const c_void) -> CUresult,
    pub module_get_function: unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CUresult,
    pub launch_kernel: unsafe extern "C" fn(
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
    ) -> CUresult,
    pub launch_host_func: unsafe extern "C" fn(Handle, HostFn, *mut c_void) -> CUresult,
    /// Only the simulated driver has it; without it only the idle wait works.
    pub launch_comm_kernel: Option<CommKernelFn>,
}

/// The kernel that stands for NCCL's: it occupies the GPU for its only parameter's nanoseconds
/// (the simulated driver's convention for kernel time), i.e. the collective's data movement.
pub const KERNEL_NAME: &CStr = c"ncclDevKernel_Generic";
pub const KERNEL_PTX: &CStr = c"
.version 7.0
.target sm_70
.address_size 64
.visible .entry ncclDevKernel_Generic(.param .u64 ns)
{
  .reg .pred %p<2>;
  .reg .b64 %rd<6>;
  ld.param.u64 %rd1, [ns];
  mov.u64 %rd2, %globaltimer;
$L_loop:
  mov.u64 %rd3, %globaltimer;
  sub.s64 %rd4, %rd3, %rd2;
  setp.lt.u64 %p1, %rd4, %rd1;
  @%p1 bra $L_loop;
  ret;
}
";

static CUDA: OnceLock<Result<Cuda, String>> = OnceLock::new();

/// The driver's entry points, or why they cannot be had.
pub fn cuda() -> Result<&'static Cuda, String> {
    CUDA.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Cuda, String> {
    // SAFETY: loading libcuda.so.1 (normally already loaded: this returns the same handle) runs
    // initializers every CUDA program runs. The handle is never closed.
    let lib = unsafe { libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW) };
    if lib.is_null() {
        return Err("cannot load libcuda.so.1".into());
    }
    // SAFETY: each symbol is typed with its cuda.h signature (CUDA 12), handles as pointers and
    // CUresult as int; the handle stays open.
    unsafe {
        Ok(Cuda {
            ctx_get_current: sym(lib, c"cuCtxGetCurrent")?,
            module_load_data: sym(lib, c"cuModuleLoadData")?,
            module_get_function: sym(lib, c"cuModuleGetFunction")?,
            launch_kernel: sym(lib, c"cuLaunchKernel")?,
            launch_host_func: sym(lib, c"cuLaunchHostFunc")?,
            launch_comm_kernel: sym(lib, c"simgpuLaunchCommKernel").ok(),
        })
    }
}

/// The function `name` of `lib` as an `F`.
///
/// # Safety
/// `lib` must be a live dlopen handle and `F` a function pointer type matching the symbol.
unsafe fn sym<F: Copy>(lib: *mut c_void, name: &CStr) -> Result<F, String> {
    // SAFETY: `lib` is live and `name` NUL-terminated.
    let p = unsafe { libc::dlsym(lib, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("libcuda.so.1 has no {}", name.to_string_lossy()));
    }
    debug_assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: F is a function pointer of the symbol's type (caller's contract), the same size
    // as a data pointer on the platforms dlsym serves.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
}

impl Cuda {
    /// The calling thread's current context, if any.
    pub fn current_ctx(&self) -> Result<Handle, String> {
        let mut ctx: Handle = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        let rc = unsafe { (self.ctx_get_current)(&mut ctx) };
        if rc != 0 || ctx.is_null() {
            return Err(format!(
                "no current CUDA context (cuCtxGetCurrent: {rc}): make the rank's GPU current first"
            ));
        }
        Ok(ctx)
    }

    /// Loads [`KERNEL_PTX`] into the current context and returns its kernel.
    pub fn load_kernel(&self) -> Result<Handle, String> {
        let (mut module, mut function): (Handle, Handle) =
            (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: a NUL-terminated PTX image and valid out-pointers.
        let rc = unsafe { (self.module_load_data)(&mut module, KERNEL_PTX.as_ptr().cast()) };
        if rc != 0 {
            return Err(format!("cuModuleLoadData: {rc}"));
        }
        // SAFETY: a module just loaded, a NUL-terminated name and a valid out-pointer.
        let rc = unsafe { (self.module_get_function)(&mut function, module, KERNEL_NAME.as_ptr()) };
        if rc != 0 {
            return Err(format!("cuModuleGetFunction: {rc}"));
        }
        Ok(function)
    }

    /// Queues the stand-in kernel for `ns` nanoseconds on `stream`.
    pub fn launch(&self, kernel: Handle, ns: u64, stream: Handle) -> CUresult {
        let mut params = [(&raw const ns).cast_mut().cast::<c_void>()];
        // SAFETY: one pointer to the kernel's one u64 parameter, read during the call.
        unsafe {
            (self.launch_kernel)(
                kernel,
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
        }
    }
}
