//! The simulated device's fixed identity and ratings, shared by the CUDA and NVML libraries.
//!
//! The numbers follow an H100 SXM closely enough that code which prints or sanity-checks them
//! sees plausible values; nothing depends on them matching a real board.

/// Device name as NVML and cuDeviceGetName report it.
pub const NAME: &str = "stallscope simulated GPU";
/// Driver version string (NVML). Below 580.82 so nvml-wrapper keeps its v12 field-id scheme.
pub const DRIVER_VERSION: &str = "580.65.06";
/// CUDA driver API version that driver ships (cuDriverGetVersion): 13.0, which PyTorch's
/// CUDA 13 wheels need.
pub const CUDA_DRIVER_VERSION: i32 = 13000;
/// The driver NVML reports under the `old-driver` fault, and its CUDA (12.2).
pub const OLD_DRIVER_VERSION: &str = "535.104.05";
pub const OLD_CUDA_DRIVER_VERSION: i32 = 12020;
/// The board's enforced power limit, mW.
pub const POWER_LIMIT_MW: u32 = 700_000;
/// Where the GPU slows itself down to cool, and what a throttled GPU reads.
pub const TEMP_SLOWDOWN_C: u32 = 87;
pub const TEMP_THROTTLED_C: u32 = 91;
/// MIG: how many slices the board can be split into, and the one slice's memory.
pub const MIG_MAX_DEVICES: u32 = 7;
pub const MIG_SLICE_BYTES: u64 = 20 << 30;
/// The PID the `dead-holder` fault lists (above any PID this machine hands out), and what it holds.
pub const DEAD_HOLDER_PID: u32 = 4_194_000;
pub const DEAD_HOLDER_BYTES: u64 = 6 << 30;

/// Device memory: 80 GiB.
pub const MEMORY_TOTAL_BYTES: u64 = 80 << 30;

/// PCI domain, device and ids (NVIDIA vendor id 0x10de, H100 SXM device id 0x2330); the bus
/// differs per GPU.
pub const PCI_DOMAIN: u32 = 0;
pub const PCI_DEVICE: u32 = 0;
pub const PCI_DEVICE_ID: u32 = 0x2330_10de;
pub const PCI_SUBSYSTEM_ID: u32 = 0x16c1_10de;
/// PCI buses of GPUs 0..8, as on an 8-GPU HGX board; GPU 0 keeps the single-GPU machine's.
const PCI_BUSES: [u32; 8] = [0x1b, 0x43, 0x52, 0x61, 0x9d, 0xc3, 0xd1, 0xdf];

/// Link the board is rated for, and what it trains to unless told otherwise.
pub const PCIE_MAX_GEN: u32 = 5;
pub const PCIE_MAX_WIDTH: u32 = 16;

/// Clocks in MHz: SM/graphics run at boost while a kernel ran in the last sample period, and drop
/// to the idle clock otherwise, which is what a real board does and what a profiler may show.
pub const SM_CLOCK_BUSY_MHZ: u32 = 1980;
pub const SM_CLOCK_IDLE_MHZ: u32 = 345;
pub const MEM_CLOCK_MHZ: u32 = 2619;
pub const VIDEO_CLOCK_MHZ: u32 = 1755;

/// Power and temperature are linear in the GPU utilization of the last sample period.
pub const POWER_IDLE_MW: u32 = 100_000;
pub const POWER_BUSY_MW: u32 = 700_000;
pub const TEMP_IDLE_C: u32 = 35;
pub const TEMP_BUSY_C: u32 = 70;

/// Streaming multiprocessors and compute capability (cuDeviceGetAttribute).
pub const SM_COUNT: i32 = 132;
pub const COMPUTE_CAPABILITY: (i32, i32) = (9, 0);

/// NVML UUID of GPU `index` (`GPU-` plus a canonical UUID); "5eed" marks it as simulated, and
/// the last group is the index plus one.
pub fn uuid(index: u32) -> String {
    format!("GPU-5eed5eed-0000-4000-8000-5eed{:08x}", index + 1)
}

/// PCI bus number of GPU `index`.
pub fn pci_bus(index: u32) -> u32 {
    PCI_BUSES[index as usize % PCI_BUSES.len()]
}

/// NVML's `busId`: `domain:bus:device.function`, 8 hex digits of domain.
pub fn pci_bus_id(index: u32) -> String {
    format!("{PCI_DOMAIN:08X}:{:02X}:{PCI_DEVICE:02X}.0", pci_bus(index))
}

/// NVML's `busIdLegacy`: as `busId` with a 4-digit domain.
pub fn pci_bus_id_legacy(index: u32) -> String {
    format!("{PCI_DOMAIN:04X}:{:02X}:{PCI_DEVICE:02X}.0", pci_bus(index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_zero_keeps_the_single_gpu_identity() {
        assert_eq!(uuid(0), "GPU-5eed5eed-0000-4000-8000-5eed00000001");
        assert_eq!(pci_bus_id(0), "00000000:1B:00.0");
        assert_eq!(pci_bus_id_legacy(0), "0000:1B:00.0");
    }

    #[test]
    fn every_gpu_has_its_own_identity() {
        let ids: std::collections::HashSet<_> = (0..8).map(|i| (uuid(i), pci_bus_id(i))).collect();
        assert_eq!(ids.len(), 8);
        assert_eq!(pci_bus_id(7), "00000000:DF:00.0");
        assert_eq!(uuid(7), "GPU-5eed5eed-0000-4000-8000-5eed00000008");
    }
}
