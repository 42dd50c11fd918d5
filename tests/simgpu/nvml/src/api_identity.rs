//! Identity and link: name, UUID, PCI info, memory, PCIe generation and width.
use std::ffi::{c_char, c_uint};
use std::sync::atomic::Ordering::Relaxed;

use simgpu_state::device;

use crate::state::{checked, snapshot};
use crate::types::{
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_INVALID_ARGUMENT, NVML_MEMORY_V2,
    nvmlDevice_t, nvmlMemory_v2_t, nvmlPciInfo_t, nvmlReturn_t,
};
use crate::{c_array, guarded, write_out, write_str};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: nvmlDevice_t,
    name: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        checked(dev)?;
        // SAFETY: `name` is NULL or a buffer of `length` bytes, per the API contract.
        unsafe { write_str(name, length, device::NAME) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: nvmlDevice_t,
    uuid: *mut c_char,
    length: c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        let gpu = checked(dev)?;
        // SAFETY: `uuid` is NULL or a buffer of `length` bytes, per the API contract.
        unsafe { write_str(uuid, length, &device::uuid(gpu.index())) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(
    dev: nvmlDevice_t,
    pci: *mut nvmlPciInfo_t,
) -> nvmlReturn_t {
    guarded(|| {
        let index = checked(dev)?.index();
        let info = nvmlPciInfo_t {
            busIdLegacy: c_array(&device::pci_bus_id_legacy(index)),
            domain: device::PCI_DOMAIN,
            bus: device::pci_bus(index),
            device: device::PCI_DEVICE,
            pciDeviceId: device::PCI_DEVICE_ID,
            pciSubSystemId: device::PCI_SUBSYSTEM_ID,
            busId: c_array(&device::pci_bus_id(index)),
        };
        // SAFETY: `pci` is NULL or an out-pointer, per the API contract.
        unsafe { write_out(pci, info) }
    })
}

/// Memory used is what the simulated processes allocated with cuMemAlloc; nothing is reserved.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(
    dev: nvmlDevice_t,
    memory: *mut nvmlMemory_v2_t,
) -> nvmlReturn_t {
    guarded(|| {
        let (dev, slice) = match crate::state::mig_parent(dev) {
            Some(gpu) => (crate::state::device_handle(gpu), true),
            None => (dev, false),
        };
        let snap = snapshot(dev)?;
        if memory.is_null() {
            return Err(NVML_ERROR_INVALID_ARGUMENT);
        }
        // SAFETY: non-null and pointing to an nvmlMemory_v2_t, per the API contract.
        let version = unsafe { (&raw const (*memory).version).read_unaligned() };
        if version != NVML_MEMORY_V2 {
            return Err(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        let total = if slice {
            device::MIG_SLICE_BYTES
        } else {
            snap.mem_total_bytes
        };
        let dead = if crate::state::faults().dead_holder {
            device::DEAD_HOLDER_BYTES
        } else {
            0
        };
        let used = (snap.mem_used_bytes() + dead).min(total);
        let info = nvmlMemory_v2_t {
            version,
            total,
            reserved: 0,
            free: total - used,
            used,
        };
        // SAFETY: as above.
        unsafe { write_out(memory, info) }
    })
}

/// Shared body of the four PCIe link queries.
///
/// # Safety
/// `out` must be NULL or an out-pointer.
unsafe fn link_value(
    dev: nvmlDevice_t,
    out: *mut c_uint,
    read: impl FnOnce(&simgpu_state::layout::DeviceState) -> c_uint,
) -> nvmlReturn_t {
    guarded(|| {
        let gpu = checked(dev)?;
        // SAFETY: forwarded caller contract.
        unsafe { write_out(out, read(&gpu)) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(
    dev: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: `value` is NULL or an out-pointer, per the API contract.
    unsafe { link_value(dev, value, |s| s.pcie_gen.load(Relaxed)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkGeneration(
    dev: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: `value` is NULL or an out-pointer, per the API contract.
    unsafe { link_value(dev, value, |s| s.pcie_max_gen.load(Relaxed)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(
    dev: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: `value` is NULL or an out-pointer, per the API contract.
    unsafe { link_value(dev, value, |s| s.pcie_width.load(Relaxed)) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxPcieLinkWidth(
    dev: nvmlDevice_t,
    value: *mut c_uint,
) -> nvmlReturn_t {
    // SAFETY: `value` is NULL or an out-pointer, per the API contract.
    unsafe { link_value(dev, value, |s| s.pcie_max_width.load(Relaxed)) }
}
