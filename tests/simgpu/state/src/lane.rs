//! The two lanes a process's kernels run on, and their SM shares. Pure: no OS calls.
//!
//! A real GPU runs kernels of several streams at once. The simulation keeps two per process: the
//! compute lane (the compute engine's kernels) and the communication lane (NCCL's kernel, on the
//! comm engine), because that is the overlap a data-parallel job has: backward kernels on the
//! compute stream while an all-reduce runs on the NCCL stream. NVML's utilization counts the time
//! at least one kernel was resident, whatever it did; the SM share of each kernel (the part of
//! the SMs it keeps active) is what GPM's SM activity adds up.

/// Which lane a kernel runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// The compute engine's kernels (cuLaunchKernel).
    Compute,
    /// The comm engine's kernel (the NCCL stand-in's collectives and point-to-point calls).
    Comm,
}

impl Lane {
    /// Index of the lane's slot in the state file.
    pub fn index(self) -> usize {
        match self {
            Lane::Compute => 0,
            Lane::Comm => 1,
        }
    }
}

/// Env var: SM share of compute kernels in percent, read by the simulated `libcuda.so.1` at
/// cuInit.
pub const SM_SHARE_ENV: &str = "STALLSCOPE_SIMGPU_SM_SHARE";
/// A busy training kernel keeps most SMs active, rarely all (tails, launch gaps inside it).
pub const DEFAULT_COMPUTE_SM_SHARE: u32 = 90;

/// A share setting (`value` of the variable `name`) in percent, 0 to 100; `default` when unset,
/// or, with a warning, when not a whole number in that range.
pub fn share_from_setting(name: &str, value: Option<&str>, default: u32) -> u32 {
    match value.map(|v| v.trim().parse::<u32>()) {
        Some(Ok(pct)) if pct <= 100 => pct,
        Some(_) => {
            eprintln!("simgpu: ignoring {name}: not a percentage from 0 to 100");
            default
        }
        None => default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_parse_within_range() {
        let share = |v| share_from_setting(SM_SHARE_ENV, v, DEFAULT_COMPUTE_SM_SHARE);
        assert_eq!(share(None), 90);
        assert_eq!(share(Some(" 50 ")), 50);
        assert_eq!(share(Some("0")), 0);
        assert_eq!(share(Some("100")), 100);
        assert_eq!(share(Some("101")), 90);
        assert_eq!(share(Some("half")), 90);
        assert_ne!(Lane::Compute.index(), Lane::Comm.index());
    }
}
