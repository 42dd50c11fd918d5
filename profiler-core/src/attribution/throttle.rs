//! A GPU whose clocks were held down while it worked (a thermal or power slowdown, a hardware
//! brake), and the clock it would have run at: what `gpu_throttled`'s what-if scales the
//! step's kernels by.
//!
//! The clock it would have run at is read, not assumed: the median busy SM clock of another
//! GPU of the same model in the recording that ran without a slowdown (the other ranks of a
//! job), else the GPU's own busy samples without one. A GPU slowed throughout, alone in its
//! recording, has no such clock and gets no estimate: NVML's maximum clock is no answer, since
//! a healthy card under load sits at its power cap well below it.
use std::collections::BTreeMap;

use crate::analysis::model::{Analysis, GpuTimeline};
use crate::nvml::clock_events::{self, Reason};

/// A GPU slowed in at least this share of its busy samples is throttled (as the straggler's
/// test in [`super::ranks`]).
pub const THROTTLED_SHARE: f64 = 0.3;
/// A clock this close to the reference's is not worth an estimate.
const SLOWER_THAN: f64 = 0.95;

/// Where the reference clock came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reference {
    /// Another GPU of the same model, by index.
    Gpu(u32),
    /// The GPU's own busy samples without a slowdown.
    Itself,
}

/// A throttled GPU's clock against the one it would have run at.
#[derive(Clone, Debug, PartialEq)]
pub struct SlowClock {
    /// Median SM clock of the slowed busy samples, MHz.
    pub mhz: u32,
    pub reference_mhz: u32,
    pub reference: Reference,
    /// The share of busy samples slowed.
    pub share: f64,
    /// NVML's names of the slowdown reasons seen.
    pub reasons: Vec<&'static str>,
}

impl SlowClock {
    /// How long a kernel takes at the reference clock, for each unit it takes now.
    pub fn kernel_scale(&self) -> f64 {
        f64::from(self.mhz) / f64::from(self.reference_mhz)
    }

    pub fn describe_reference(&self) -> String {
        match self.reference {
            Reference::Gpu(i) => format!("GPU {i}'s, the same model unslowed"),
            Reference::Itself => "its own while not slowed".to_owned(),
        }
    }
}

/// A GPU's busy samples: how many were slowed by a reason that slows any load and how many
/// not, each kind's median SM clock, and the reasons seen.
struct BusyClocks {
    slowed: usize,
    free: usize,
    slowed_mhz: Option<u32>,
    free_mhz: Option<u32>,
    reasons: u64,
}

fn busy_clocks(g: &GpuTimeline) -> BusyClocks {
    let (mut slowed, mut free, mut reasons) = (Vec::new(), Vec::new(), 0);
    for s in &g.states {
        let Some(r) = s
            .throttle_reasons
            .filter(|r| r & clock_events::GPU_IDLE == 0)
        else {
            continue;
        };
        let Some(mhz) = s.sm_clock_mhz.filter(|m| *m > 0) else {
            continue;
        };
        if clock_events::slows_any_load(r) {
            slowed.push(mhz);
            reasons |= r;
        } else {
            free.push(mhz);
        }
    }
    BusyClocks {
        slowed: slowed.len(),
        free: free.len(),
        slowed_mhz: median(slowed),
        free_mhz: median(free),
        reasons,
    }
}

fn median(mut v: Vec<u32>) -> Option<u32> {
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// Each throttled GPU of `a` with a clock to compare, by index.
pub fn slow_clocks(a: &Analysis) -> BTreeMap<u32, SlowClock> {
    let clocks: Vec<(&GpuTimeline, BusyClocks)> =
        a.gpus.values().map(|g| (g, busy_clocks(g))).collect();
    let mut out = BTreeMap::new();
    for (g, c) in &clocks {
        let busy = c.slowed + c.free;
        if busy == 0 || (c.slowed as f64) < THROTTLED_SHARE * busy as f64 {
            continue;
        }
        let others = clocks
            .iter()
            .filter(|(o, _)| o.info.index != g.info.index && o.info.name == g.info.name)
            .filter_map(|(o, oc)| Some((oc.free_mhz?, o.info.index)))
            .max();
        let reference = others
            .map(|(mhz, i)| (mhz, Reference::Gpu(i)))
            .or_else(|| c.free_mhz.map(|mhz| (mhz, Reference::Itself)));
        let (Some(mhz), Some((reference_mhz, reference))) = (c.slowed_mhz, reference) else {
            continue;
        };
        if f64::from(mhz) >= SLOWER_THAN * f64::from(reference_mhz) {
            continue;
        }
        let mut named: Vec<&'static Reason> = clock_events::set_in(c.reasons)
            .filter(|r| r.slows_any_load)
            .collect();
        named.sort_by_key(|r| r.bit);
        out.insert(
            g.info.index,
            SlowClock {
                mhz,
                reference_mhz,
                reference,
                share: c.slowed as f64 / busy as f64,
                reasons: named.into_iter().map(|r| r.key).collect(),
            },
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recording::record::{GpuInfo, GpuState};

    fn gpu(index: u32, name: &str, states: &[(u32, u64)]) -> GpuTimeline {
        let mut g = GpuTimeline {
            info: GpuInfo {
                index,
                name: name.into(),
                ..GpuInfo::default()
            },
            ..GpuTimeline::default()
        };
        g.states = states
            .iter()
            .enumerate()
            .map(|(i, &(mhz, reasons))| GpuState {
                gpu: index,
                ts_ns: i as u64,
                sm_clock_mhz: Some(mhz),
                throttle_reasons: Some(reasons),
                ..GpuState::default()
            })
            .collect();
        g
    }

    fn analysis(gpus: Vec<GpuTimeline>) -> Analysis {
        let mut a = Analysis::default();
        for g in gpus {
            a.gpus.insert(g.info.index, g);
        }
        a
    }

    const THERMAL: u64 = clock_events::SW_THERMAL | clock_events::HW_SLOWDOWN;

    #[test]
    fn a_throttled_rank_is_compared_with_another_gpu_of_its_model() {
        let a = analysis(vec![
            gpu(
                0,
                "H100",
                &[(1800, 0), (1790, 0), (300, clock_events::GPU_IDLE)],
            ),
            gpu(1, "H100", &[(600, THERMAL), (610, THERMAL), (1700, 0)]),
            // Another model, faster, is no reference.
            gpu(2, "B200", &[(2100, 0), (2100, 0)]),
        ]);
        let slow = slow_clocks(&a);
        assert_eq!(slow.len(), 1, "{slow:?}");
        let c = &slow[&1];
        assert_eq!((c.mhz, c.reference_mhz), (610, 1800));
        assert_eq!(c.reference, Reference::Gpu(0));
        assert!((c.share - 2.0 / 3.0).abs() < 1e-9);
        assert!((c.kernel_scale() - 610.0 / 1800.0).abs() < 1e-9);
        assert_eq!(c.reasons, ["hw_slowdown", "sw_thermal_slowdown"]);
    }

    #[test]
    fn alone_it_is_compared_with_its_own_unslowed_samples_or_not_at_all() {
        let a = analysis(vec![gpu(
            0,
            "H100",
            &[(700, THERMAL), (700, THERMAL), (1750, 0)],
        )]);
        let c = &slow_clocks(&a)[&0];
        assert_eq!(
            (c.mhz, c.reference_mhz, &c.reference),
            (700, 1750, &Reference::Itself)
        );
        let throughout = analysis(vec![gpu(0, "H100", &[(700, THERMAL), (700, THERMAL)])]);
        assert!(slow_clocks(&throughout).is_empty());
    }

    #[test]
    fn a_power_cap_a_rare_slowdown_or_a_clock_near_the_reference_is_not_throttling() {
        let capped = clock_events::SW_POWER_CAP;
        let a = analysis(vec![
            gpu(0, "H100", &[(1470, capped), (1470, capped), (1470, capped)]),
            gpu(
                1,
                "H100",
                &[(600, THERMAL), (1800, 0), (1800, 0), (1800, 0)],
            ),
            gpu(2, "A100", &[(1350, THERMAL), (1400, 0)]),
        ]);
        assert!(slow_clocks(&a).is_empty(), "{:?}", slow_clocks(&a));
    }
}
