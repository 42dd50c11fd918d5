//! The GPU's PCIe link as NVML reported it, and whether it limits copies.
use serde::Serialize;

use crate::analysis::model::GpuTimeline;

/// Copies achieving less than this share of what the full link gives are "far less".
const FAR_BELOW: f64 = 0.5;
/// NVML's PCIe throughput at this share of the current link's capacity is saturation.
const SATURATED: f64 = 0.8;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LinkState {
    pub generation: u32,
    pub width: u32,
    pub max_gen: u32,
    pub max_width: u32,
    /// NVML's PCIe throughput, host to device (rx) and device to host (tx), GB/s.
    pub rx_gbps: Option<f64>,
    pub tx_gbps: Option<f64>,
}

/// Usable GB/s per lane after line encoding: 8b/10b for generation 1–2, 128b/130b from generation 3.
pub fn lane_gbps(generation: u32) -> f64 {
    match generation {
        1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        6 => 7.563,
        _ => 0.0,
    }
}

impl LinkState {
    /// The link's state at `ts_ns`: the last state sampled at or before it, else the first.
    pub fn at(g: &GpuTimeline, ts_ns: u64) -> Option<Self> {
        let i = g.states.partition_point(|s| s.ts_ns <= ts_ns);
        let s = g.states[..i]
            .iter()
            .rev()
            .chain(g.states[i..].iter())
            .find(|s| s.pcie_gen.is_some() && s.pcie_width.is_some())?;
        let kbps = |v: Option<u32>| v.map(|k| f64::from(k) * 1e3 / 1e9);
        Some(Self {
            generation: s.pcie_gen?,
            width: s.pcie_width?,
            max_gen: g.info.pcie_max_gen,
            max_width: g.info.pcie_max_width,
            rx_gbps: kbps(s.pcie_rx_kbps),
            tx_gbps: kbps(s.pcie_tx_kbps),
        })
    }

    pub fn degraded(&self) -> bool {
        (self.max_gen > 0 && self.generation < self.max_gen)
            || (self.max_width > 0 && self.width < self.max_width)
    }

    pub fn current_gbps(&self) -> f64 {
        lane_gbps(self.generation) * f64::from(self.width)
    }

    pub fn max_gbps(&self) -> f64 {
        lane_gbps(self.max_gen.max(self.generation)) * f64::from(self.max_width.max(self.width))
    }

    pub fn saturated(&self) -> bool {
        let cap = self.current_gbps();
        cap > 0.0
            && [self.rx_gbps, self.tx_gbps]
                .into_iter()
                .flatten()
                .any(|g| g >= SATURATED * cap)
    }

    /// Whether the link explains slow copies that achieved `achieved_gbps` (unknown: the link
    /// state alone decides).
    pub fn limits(&self, achieved_gbps: Option<f64>) -> bool {
        if self.saturated() {
            return true;
        }
        self.degraded() && achieved_gbps.is_none_or(|a| a < FAR_BELOW * self.max_gbps())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(generation: u32, width: u32) -> LinkState {
        LinkState {
            generation,
            width,
            max_gen: 5,
            max_width: 16,
            rx_gbps: None,
            tx_gbps: None,
        }
    }

    #[test]
    fn a_trained_down_link_limits_slow_copies_only() {
        let x4 = link(3, 4);
        assert!(x4.degraded());
        assert!(x4.limits(Some(3.0)));
        assert!(!x4.limits(Some(40.0)));
        assert!(!link(5, 16).limits(Some(1.0)));
    }

    #[test]
    fn a_saturated_full_link_limits() {
        let mut full = link(5, 16);
        full.rx_gbps = Some(55.0);
        assert!(full.saturated());
        assert!(full.limits(Some(50.0)));
    }
}
