//! Modules, functions, kernel launches, host functions, and the NCCL stand-in's comm kernels.
//!
//! A kernel runs for as many nanoseconds as its first parameter says: `kernelParams[0]` points
//! to a u64. That is the signature of stallgen's PTX kernel `spin(u64 ns)`, so the same workload
//! code runs on a real GPU and here. Parameters are read at launch, as the driver copies them.
//! It keeps `STALLSCOPE_SIMGPU_SM_SHARE` percent of the SMs active (GPM's SM activity).
use std::ffi::{CStr, c_char, c_uint, c_void};

use simgpu_state::clock::monotonic_ns;

use crate::driver::{current_ctx, driver};
use crate::engine::{HostFn, MAX_KERNEL_NS, Work};
use crate::ptx::{self, Image};
use crate::result::{
    CUDA_ERROR_INVALID_HANDLE, CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_NOT_FOUND, CUresult, CuResult,
};
use crate::tables::{FunctionInfo, ModuleInfo};
use crate::{guarded, handle, per_thread, to_handle, write_out};

type CUmodule = *mut c_void;
type CUfunction = *mut c_void;
type CUstream = *mut c_void;

/// `CUlaunchConfig` from cuda.h (CUDA 12).
#[repr(C)]
pub struct CUlaunchConfig {
    pub grid_dim: [c_uint; 3],
    pub block_dim: [c_uint; 3],
    pub shared_mem_bytes: c_uint,
    pub stream: CUstream,
    pub attrs: *mut c_void,
    pub num_attrs: c_uint,
}

/// CPU time a launch costs the calling thread: what the real driver's launch path (argument
/// marshalling, the push buffer, the doorbell) takes on a server CPU. Without it the simulated
/// launch is cheaper than the engine's own bookkeeping per kernel, and a stream of tiny kernels
/// would queue up on the device instead of starving it, as tiny kernels do on a real GPU.
const LAUNCH_CPU_NS: u64 = 4_000;

/// `extra` keys: CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE.
const PARAM_END: usize = 0;
const PARAM_BUFFER_POINTER: usize = 1;
const PARAM_BUFFER_SIZE: usize = 2;

/// Reads a module image: PTX text (NUL-terminated) or a cubin/fatbin.
///
/// # Safety
/// `image` must point to a NUL-terminated PTX string or to a binary image of at least 4 bytes.
unsafe fn read_image(image: *const c_void) -> CuResult<Image> {
    let bytes = image.cast::<u8>();
    let mut head = [0u8; 4];
    for (i, b) in head.iter_mut().enumerate() {
        // SAFETY: every byte before a NUL is in bounds for either kind of image.
        *b = unsafe { bytes.add(i).read() };
        if *b == 0 {
            break;
        }
    }
    if ptx::is_binary(head) {
        return Ok(Image::Binary);
    }
    // SAFETY: not a binary image, so NUL-terminated PTX text (API contract).
    let text = unsafe { CStr::from_ptr(image.cast::<c_char>()) }.to_string_lossy();
    let entries = ptx::entries(&text);
    if entries.is_empty() {
        return Err(CUDA_ERROR_INVALID_IMAGE);
    }
    Ok(Image::Ptx(entries))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        if module.is_null() || image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let ctx = driver.require_ctx(&driver.tables())?;
        // SAFETY: `image` is a module image, per the API contract.
        let image = unsafe { read_image(image) }?;
        let mut tables = driver.tables();
        let h = tables.new_handle();
        tables.modules.insert(h, ModuleInfo { ctx, image });
        // SAFETY: `module` is a non-null out-pointer, per the API contract.
        unsafe { write_out(module, to_handle(h)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    hfunc: *mut CUfunction,
    hmod: CUmodule,
    name: *const c_char,
) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        if hfunc.is_null() || name.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `name` is a NUL-terminated string, per the API contract.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let module = handle(hmod);
        let mut tables = driver.tables();
        let info = tables
            .modules
            .get(&module)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        let has_params = match &info.image {
            Image::Binary => true,
            Image::Ptx(entries) => {
                entries
                    .iter()
                    .find(|e| e.name == name)
                    .ok_or(CUDA_ERROR_NOT_FOUND)?
                    .has_params
            }
        };
        let existing = tables
            .functions
            .iter()
            .find(|(_, f)| f.module == module && f.name == name)
            .map(|(h, _)| *h);
        let h = existing.unwrap_or_else(|| {
            let h = tables.new_handle();
            let function = FunctionInfo {
                module,
                name,
                has_params,
            };
            tables.functions.insert(h, function);
            h
        });
        // SAFETY: `hfunc` is a non-null out-pointer, per the API contract.
        unsafe { write_out(hfunc, to_handle(h)) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(hmod: CUmodule) -> CUresult {
    guarded(|| {
        let driver = driver()?;
        if driver.tables().remove_module(handle(hmod)) {
            Ok(())
        } else {
            Err(CUDA_ERROR_INVALID_HANDLE)
        }
    })
}

/// The kernel's run time: the u64 its first parameter points to, or the first 8 bytes of an
/// `extra` parameter buffer; 0 when the kernel has no parameters.
///
/// # Safety
/// `params` and `extra` must follow cuLaunchKernel's contract for a kernel with parameters.
unsafe fn duration_ns(params: *mut *mut c_void, extra: *mut *mut c_void) -> u64 {
    if !params.is_null() {
        // SAFETY: a kernel with parameters gets an array with one pointer per parameter.
        let first = unsafe { params.read() };
        if first.is_null() {
            return 0;
        }
        // SAFETY: the first parameter pointer points to the parameter's value (a u64 for spin).
        return unsafe { first.cast::<u64>().read_unaligned() }.min(MAX_KERNEL_NS);
    }
    if extra.is_null() {
        return 0;
    }
    let (mut buffer, mut size) = (std::ptr::null::<u8>(), 0usize);
    // SAFETY: `extra` is a key/value array ending with CU_LAUNCH_PARAM_END; the bound on `i`
    // guards against a missing terminator.
    unsafe {
        let mut i = 0;
        while i < 64 {
            let key = extra.add(i).read() as usize;
            if key == PARAM_END {
                break;
            }
            let value = extra.add(i + 1).read();
            match key {
                PARAM_BUFFER_POINTER => buffer = value.cast::<u8>(),
                PARAM_BUFFER_SIZE if !value.is_null() => size = value.cast::<usize>().read(),
                _ => {}
            }
            i += 2;
        }
        if buffer.is_null() || size < 8 {
            return 0;
        }
        buffer.cast::<u64>().read_unaligned().min(MAX_KERNEL_NS)
    }
}

/// Spins the calling thread on-CPU for `ns`.
fn host_work(ns: u64) {
    let until = monotonic_ns() + ns;
    while monotonic_ns() < until {
        std::hint::spin_loop();
    }
}

/// Queues a kernel launch.
///
/// # Safety
/// `params`/`extra` as for cuLaunchKernel.
unsafe fn launch(
    f: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    stream: u64,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuResult<()> {
    let driver = driver()?;
    if grid.contains(&0) || block.contains(&0) || block.iter().product::<c_uint>() > 1024 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    host_work(LAUNCH_CPU_NS);
    let mut tables = driver.tables();
    let has_params = tables
        .functions
        .get(&handle(f))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .has_params;
    let key = tables.stream(stream, current_ctx())?;
    let duration_ns = if has_params {
        // SAFETY: forwarded caller contract.
        unsafe { duration_ns(params, extra) }
    } else {
        0
    };
    let work = Work::Kernel {
        duration_ns,
        sm_share_pct: driver.compute_sm_share,
    };
    driver.submit(&mut tables, key, work);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { launch(f, grid, block, handle(stream), params, extra) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: CUfunction,
    grid_x: c_uint,
    grid_y: c_uint,
    grid_z: c_uint,
    block_x: c_uint,
    block_y: c_uint,
    block_z: c_uint,
    _shared_mem_bytes: c_uint,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    let (grid, block) = ([grid_x, grid_y, grid_z], [block_x, block_y, block_z]);
    let stream = per_thread(handle(stream));
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { launch(f, grid, block, stream, params, extra) })
}

/// cuLaunchKernelEx's body; `ptsz` for the per-thread default stream variant.
///
/// # Safety
/// As for cuLaunchKernelEx.
unsafe fn launch_ex(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
    ptsz: bool,
) -> CuResult<()> {
    if config.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: a non-null config points to a CUlaunchConfig (API contract).
    let config = unsafe { &*config };
    let stream = handle(config.stream);
    let stream = if ptsz { per_thread(stream) } else { stream };
    // SAFETY: forwarded caller contract (cuda.h).
    unsafe { launch(f, config.grid_dim, config.block_dim, stream, params, extra) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { launch_ex(config, f, params, extra, false) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernelEx_ptsz(
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: forwarded caller contract (cuda.h).
    guarded(|| unsafe { launch_ex(config, f, params, extra, true) })
}

/// Queues `func(data)` on `stream`.
fn launch_host_func(stream: u64, func: Option<HostFn>, data: *mut c_void) -> CuResult<()> {
    let driver = driver()?;
    let func = func.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut tables = driver.tables();
    let key = tables.stream(stream, current_ctx())?;
    let work = Work::Host {
        func,
        data: data as usize,
    };
    driver.submit(&mut tables, key, work);
    Ok(())
}

/// Runs `func(data)` on a driver thread once the stream's earlier work is done; later work waits
/// for it to return. The GPU counts as idle meanwhile (no kernel runs).
#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchHostFunc(
    stream: CUstream,
    func: Option<HostFn>,
    data: *mut c_void,
) -> CUresult {
    guarded(|| launch_host_func(handle(stream), func, data))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuLaunchHostFunc_ptsz(
    stream: CUstream,
    func: Option<HostFn>,
    data: *mut c_void,
) -> CUresult {
    guarded(|| launch_host_func(per_thread(handle(stream)), func, data))
}

/// Queues a comm kernel on `stream`.
fn launch_comm_kernel(
    stream: u64,
    wait: Option<HostFn>,
    data: *mut c_void,
    transfer_ns: u64,
    sm_share_pct: u32,
) -> CuResult<()> {
    let driver = driver()?;
    if sm_share_pct > 100 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // NCCL launches its kernel with cuLaunchKernel, so it costs the caller a launch.
    host_work(LAUNCH_CPU_NS);
    let mut tables = driver.tables();
    let key = tables.stream(stream, current_ctx())?;
    let work = Work::CommKernel {
        wait,
        data: data as usize,
        transfer_ns: transfer_ns.min(MAX_KERNEL_NS),
        sm_share_pct,
    };
    driver.submit(&mut tables, key, work);
    Ok(())
}

/// Not a CUDA entry point: the simulated NCCL's way to queue its kernel. When `stream` reaches
/// it, a kernel starts on the GPU's comm lane with `sm_share_pct` percent of the SMs, then
/// `wait(data)` runs on the comm engine thread (the rendezvous: it returns once the peers have
/// arrived), then the kernel spins `transfer_ns` (the data movement) and ends; later work of the
/// stream waits for all of it. The GPU counts as busy throughout, as it does while a real NCCL
/// kernel spins waiting for a late rank.
///
/// Real NCCL waits inside its kernel; a driver cannot run host code inside a kernel, hence this
/// private entry point instead of cuLaunchHostFunc (idle) plus cuLaunchKernel.
#[unsafe(no_mangle)]
pub extern "C" fn simgpuLaunchCommKernel(
    stream: CUstream,
    wait: Option<HostFn>,
    data: *mut c_void,
    transfer_ns: u64,
    sm_share_pct: u32,
) -> CUresult {
    guarded(|| launch_comm_kernel(handle(stream), wait, data, transfer_ns, sm_share_pct))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_config_matches_cuda_h() {
        assert_eq!(std::mem::offset_of!(CUlaunchConfig, stream), 32);
        assert_eq!(std::mem::offset_of!(CUlaunchConfig, num_attrs), 48);
        assert_eq!(std::mem::size_of::<CUlaunchConfig>(), 56);
    }

    #[test]
    fn durations_come_from_params_or_extra() {
        let mut ns: u64 = 1234;
        let mut params = [(&raw mut ns).cast::<c_void>()];
        // SAFETY: a one-parameter array pointing to a u64.
        let from_params = unsafe { duration_ns(params.as_mut_ptr(), std::ptr::null_mut()) };
        assert_eq!(from_params, 1234);
        let mut buffer = 99u64.to_le_bytes();
        let mut size = 8usize;
        let mut extra = [
            PARAM_BUFFER_POINTER as *mut c_void,
            buffer.as_mut_ptr().cast(),
            PARAM_BUFFER_SIZE as *mut c_void,
            (&raw mut size).cast(),
            PARAM_END as *mut c_void,
        ];
        // SAFETY: a terminated extra array with a valid buffer and size.
        let from_extra = unsafe { duration_ns(std::ptr::null_mut(), extra.as_mut_ptr()) };
        assert_eq!(from_extra, 99);
        // SAFETY: NULL params and extra are allowed.
        let from_nothing = unsafe { duration_ns(std::ptr::null_mut(), std::ptr::null_mut()) };
        assert_eq!(from_nothing, 0);
        let mut huge = u64::MAX;
        let mut params = [(&raw mut huge).cast::<c_void>()];
        // SAFETY: as above.
        let clamped = unsafe { duration_ns(params.as_mut_ptr(), std::ptr::null_mut()) };
        assert_eq!(clamped, MAX_KERNEL_NS);
    }
}
