//! How a rank's stream waits for its peers: busy (the default) or idle. Pure: no OS calls.
//!
//! On a real GPU NCCL's kernel is already resident when a rank reaches a collective first, and
//! spins on the GPU until the peers arrive: NVML's utilization reads the wait as busy (a kernel
//! was resident), and only GPM's SM activity shows how little ran (the spinning kernel keeps a
//! small share of the SMs, about 15%, see NVIDIA/nccl issue 1432). `Busy` simulates that with the
//! driver's comm kernel (`simgpuLaunchCommKernel`): one kernel on the comm lane for the wait and
//! the transfer. `Idle` is the older simulation, kept for tests that want a straggler to show as
//! GPU idle time: a host function that waits (the GPU idles) and then a kernel for the transfer.

/// Env var: `idle` for the idle wait; anything else (or unset) is the busy wait. Read at
/// ncclCommInitRank.
pub const WAIT_ENV: &str = "STALLSCOPE_SIMGPU_NCCL_WAIT";
/// Env var: SM share of the comm kernel in percent (busy wait only). Read at ncclCommInitRank.
pub const SM_SHARE_ENV: &str = "STALLSCOPE_SIMGPU_NCCL_SM_SHARE";
/// What a spinning NCCL kernel keeps of an H100's SMs, roughly (its channels' blocks).
pub const DEFAULT_SM_SHARE: u32 = 15;

/// How a communicator's operations wait for the other ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// One comm kernel for wait and transfer, with this SM share: the GPU is busy throughout.
    Busy { sm_share_pct: u32 },
    /// A host function for the wait (GPU idle), then the stand-in kernel for the transfer.
    Idle,
}

impl WaitMode {
    /// The mode from the values of `STALLSCOPE_SIMGPU_NCCL_WAIT` and
    /// `STALLSCOPE_SIMGPU_NCCL_SM_SHARE`.
    pub fn from_settings(wait: Option<&str>, share: Option<&str>) -> Self {
        match wait.map(str::trim) {
            Some(w) if w.eq_ignore_ascii_case("idle") => WaitMode::Idle,
            Some(w) if !w.is_empty() && !w.eq_ignore_ascii_case("busy") => {
                eprintln!("simgpu: ignoring {WAIT_ENV}={w:?}: expected busy or idle");
                Self::busy(share)
            }
            _ => Self::busy(share),
        }
    }

    fn busy(share: Option<&str>) -> Self {
        WaitMode::Busy {
            sm_share_pct: simgpu_state::lane::share_from_setting(
                SM_SHARE_ENV,
                share,
                DEFAULT_SM_SHARE,
            ),
        }
    }

    /// The mode from the environment.
    pub fn from_env() -> Self {
        let var = |k| std::env::var(k).ok();
        Self::from_settings(var(WAIT_ENV).as_deref(), var(SM_SHARE_ENV).as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_by_default_idle_on_request() {
        let busy = |pct| WaitMode::Busy { sm_share_pct: pct };
        assert_eq!(WaitMode::from_settings(None, None), busy(15));
        assert_eq!(WaitMode::from_settings(Some("busy"), Some("30")), busy(30));
        assert_eq!(
            WaitMode::from_settings(Some(" IDLE "), Some("30")),
            WaitMode::Idle
        );
        assert_eq!(WaitMode::from_settings(Some("spin"), None), busy(15));
        assert_eq!(WaitMode::from_settings(None, Some("200")), busy(15));
    }
}
