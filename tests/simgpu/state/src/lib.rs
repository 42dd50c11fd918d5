//! Shared device state of the simulated GPU: one fixed-size file, mapped by every process that
//! loads the simulated `libcuda.so.1` or `libnvidia-ml.so.1`.
//!
//! The CUDA side writes what the device did (kernel busy intervals, copies, memory, processes);
//! the NVML side reads a [`Snapshot`] and turns it into NVML answers with the pure functions in
//! [`window`] and [`samples`]. Both libraries link this crate, so constants here are the device
//! configuration that never changes ([`device`]); what can change (the PCIe link) lives in the
//! file ([`layout`]).
pub mod clock;
pub mod device;
pub mod install;
pub mod layout;
mod lock;
pub mod pcie;
mod record;
pub mod samples;
mod shm;
pub mod window;

pub use install::{install_dir, target_release_dir};
pub use layout::{BUCKET_NS, PERIOD_NS};
pub use pcie::{Direction, PcieLink};
pub use samples::{ProcessSample, SampleClock, UtilSample};
pub use shm::{DEFAULT_STATE_PATH, InitConfig, PCIE_ENV, STATE_ENV, SharedDevice};
pub use window::{ProcView, Snapshot};
