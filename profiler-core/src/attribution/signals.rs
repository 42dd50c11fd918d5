//! Which of the signals a cause's score reads the recording holds. A cause without one is not
//! scored: the report lists it as unchecked, with why, instead of implying it was ruled out.
use serde::{Deserialize, Serialize};

use super::causes::{CAUSES, Cause, Signal};
use crate::analysis::model::Analysis;

/// A cause the recording could not judge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unchecked {
    pub cause: Cause,
    pub missing: Vec<Signal>,
    /// Why, in words: the first missing signal's reason.
    pub reason: String,
}

/// Why `signal` is missing from `a`; `None` when it is there.
pub fn missing(a: &Analysis, signal: Signal) -> Option<String> {
    let said = |prefix: &str| {
        a.unavailable
            .iter()
            .find(|u| u.signal.starts_with(prefix))
            .map(|u| u.reason.clone())
    };
    let gpus = a.gpus.values().filter(|g| !g.samples.is_empty());
    match signal {
        Signal::Scheduler => None,
        Signal::CudaProbes => a.cuda.libraries.is_empty().then(|| {
            said("cuda").unwrap_or_else(|| {
                "the CUDA probes were on no library: no traced process mapped libcuda, \
                 libcudart or libnccl (or --no-cuda-probes)"
                    .into()
            })
        }),
        Signal::PcieLink => {
            let mut gpus = gpus;
            gpus.all(|g| g.info.pcie_max_gen == 0 || g.info.pcie_max_width == 0)
                .then(|| "NVML gave no PCIe link generation and width".into())
        }
        Signal::LaunchCounts => (a.cuda.launch_probed_ns == 0).then(|| {
            "the kernel-launch probes were never on (--launch-duty 0, --no-cuda-probes, or no \
             launch entry point was probed)"
                .into()
        }),
        Signal::GpuClocks => {
            let mut gpus = gpus;
            gpus.all(|g| g.states.iter().all(|s| s.sm_clock_mhz.is_none()))
                .then(|| "NVML gave no SM clock".into())
        }
    }
}

/// Every cause whose score reads a signal `a` lacks, in the registry's order.
pub fn unchecked(a: &Analysis) -> Vec<Unchecked> {
    let mut out = Vec::new();
    for spec in &CAUSES {
        let why: Vec<(Signal, String)> = spec
            .needs
            .iter()
            .filter_map(|&s| missing(a, s).map(|r| (s, r)))
            .collect();
        if let Some((_, reason)) = why.first() {
            out.push(Unchecked {
                cause: spec.cause,
                reason: reason.clone(),
                missing: why.iter().map(|(s, _)| *s).collect(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::model::{GpuSample, GpuTimeline};
    use crate::cuda::{Library, ProbedLibrary};
    use crate::recording::record::{GpuInfo, GpuState};

    fn with_gpu(pcie: bool, clocks: bool) -> Analysis {
        let mut a = Analysis::default();
        let g = GpuTimeline {
            info: GpuInfo {
                pcie_max_gen: if pcie { 4 } else { 0 },
                pcie_max_width: if pcie { 16 } else { 0 },
                ..GpuInfo::default()
            },
            samples: vec![GpuSample {
                ts_ns: 200,
                period_ns: 100,
                util_pct: 10,
            }],
            states: vec![GpuState {
                sm_clock_mhz: clocks.then_some(1980),
                ..GpuState::default()
            }],
            ..GpuTimeline::default()
        };
        a.gpus.insert(0, g);
        a
    }

    fn names(u: &[Unchecked]) -> Vec<&'static str> {
        u.iter().map(|u| u.cause.name()).collect()
    }

    #[test]
    fn without_probes_the_probe_causes_are_unchecked_and_the_host_causes_are_not() {
        let a = with_gpu(true, true);
        let u = unchecked(&a);
        assert_eq!(
            names(&u),
            ["pinned_memory_copy", "pcie", "nccl_wait", "launch_overhead"]
        );
        assert!(
            u[0].reason.contains("no traced process mapped libcuda"),
            "{u:?}"
        );
        assert_eq!(u[3].missing, [Signal::LaunchCounts]);
    }

    #[test]
    fn with_every_signal_nothing_is_unchecked() {
        let mut a = with_gpu(true, true);
        a.cuda.libraries.push(ProbedLibrary {
            pid: 1,
            path: "/usr/lib/libcuda.so.1".into(),
            library: Library::Driver,
            attached: 20,
            missing: Vec::new(),
            attached_ns: 0,
        });
        a.cuda.launch_probed_ns = 20_000_000;
        assert_eq!(unchecked(&a), []);
        // NVML without the link or the clocks leaves pcie and gpu_throttled unjudged.
        let mut b = with_gpu(false, false);
        b.cuda = a.cuda.clone();
        let u = unchecked(&b);
        assert_eq!(names(&u), ["pcie", "gpu_throttled"]);
        assert_eq!(u[0].missing, [Signal::PcieLink]);
    }
}
