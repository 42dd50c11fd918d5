//! A handle on one GPU of the machine: its part of the state file plus the machine-wide clock
//! offsets that its snapshots need. The record and snapshot operations are on this type (see
//! `record`).
use crate::layout::{DeviceState, StateFile};
use crate::shm::SharedState;

/// GPU `index` of a mapped state file. Copy it freely: it is two references and a number.
#[derive(Clone, Copy)]
pub struct Gpu<'a> {
    file: &'a StateFile,
    index: u32,
}

impl<'a> Gpu<'a> {
    /// The caller checked `index` against the file's device count.
    pub(crate) fn new(state: &'a SharedState, index: u32) -> Self {
        Gpu { file: state, index }
    }

    /// The device ordinal (CUDA) and index (NVML).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The machine-wide part of the file (clock offsets).
    pub(crate) fn file(&self) -> &'a StateFile {
        self.file
    }
}

impl<'a> std::ops::Deref for Gpu<'a> {
    type Target = DeviceState;

    fn deref(&self) -> &'a DeviceState {
        &self.file.devices[self.index as usize]
    }
}

impl std::fmt::Debug for Gpu<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({})", self.index)
    }
}
