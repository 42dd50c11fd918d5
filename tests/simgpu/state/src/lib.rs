//! Shared device state of the simulated GPUs: one fixed-size file per simulated machine, mapped
//! by every process that loads the simulated `libcuda.so.1`, `libnvidia-ml.so.1` or
//! `libnccl.so.2`. The machine has 1 to [`MAX_DEVICES`] GPUs ([`Gpu`]), each with its own
//! timeline, processes and PCIe link.
//!
//! The CUDA side writes what the device did (kernel busy intervals on each process's compute and
//! comm [`Lane`], with their SM shares; copies, memory, processes);
//! the NVML side reads a [`Snapshot`] and turns it into NVML answers with the pure functions in
//! [`window`] and [`samples`]. Both libraries link this crate, so constants here are the device
//! configuration that never changes ([`device`]); what can change (the PCIe link) lives in the
//! file ([`layout`]).
pub mod clock;
pub mod device;
mod gpu;
pub mod host;
pub mod install;
pub mod lane;
pub mod layout;
mod lock;
pub mod pcie;
mod record;
pub mod samples;
mod shm;
pub mod window;

pub use gpu::Gpu;
pub use host::{HOST_GBPS_ENV, host_copy_ns};
pub use install::{BUILD_HINT, install_dir, target_release_dir};
pub use lane::Lane;
pub use layout::MAX_DEVICES;
pub use layout::{BUCKET_NS, PERIOD_NS};
pub use pcie::{Direction, PcieLink};
pub use record::Totals;
pub use samples::{ProcessSample, SampleClock, UtilSample};
pub use shm::{
    DEFAULT_STATE_PATH, DEVICES_ENV, InitConfig, PCIE_ENV, STATE_ENV, SharedState, THROTTLE_ENV,
    parse_devices, parse_throttle, state_path_from_env,
};
pub use window::{ProcView, Snapshot};
