//! PCIe link model: per-lane rates by generation, copy durations, and the link setting's text
//! form (`"gen,width"`, as in `STALLSCOPE_SIMGPU_PCIE=3,4`).
use crate::device::{PCIE_MAX_GEN, PCIE_MAX_WIDTH};

/// Usable payload rate per lane in bytes/s, for generations 1 to 5 (after line coding).
const LANE_BYTES_PER_S: [f64; 5] = [0.25e9, 0.5e9, 0.985e9, 1.969e9, 3.938e9];
/// Share of the raw lane rate a DMA copy achieves (TLP headers, flow control).
const EFFICIENCY: f64 = 0.8;

/// Which way a copy moves data. NVML counts from the GPU's side: TX is device to host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    HostToDevice,
    DeviceToHost,
}

/// A trained link: generation 1..=5 and width in lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PcieLink {
    pub generation: u32,
    pub width: u32,
}

impl PcieLink {
    /// The link the board is rated for.
    pub const MAX: PcieLink = PcieLink {
        generation: PCIE_MAX_GEN,
        width: PCIE_MAX_WIDTH,
    };

    /// A link the simulated board can train to, or why not.
    pub fn new(generation: u32, width: u32) -> Result<Self, String> {
        if !(1..=PCIE_MAX_GEN).contains(&generation) {
            return Err(format!(
                "PCIe gen {generation} is not in 1..={PCIE_MAX_GEN}"
            ));
        }
        if !width.is_power_of_two() || width > PCIE_MAX_WIDTH {
            return Err(format!(
                "PCIe width x{width} is not one of x1, x2, x4, x8, x{PCIE_MAX_WIDTH}"
            ));
        }
        Ok(PcieLink { generation, width })
    }

    /// Parses `"gen,width"`, e.g. `"3,4"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (generation, width) = text
            .split_once(',')
            .ok_or_else(|| format!("expected \"gen,width\", got {text:?}"))?;
        let number = |s: &str| {
            s.trim()
                .parse::<u32>()
                .map_err(|e| format!("bad number {s:?} in {text:?}: {e}"))
        };
        PcieLink::new(number(generation)?, number(width)?)
    }

    /// Achieved copy bandwidth in bytes per second.
    pub fn bytes_per_s(self) -> f64 {
        let lane = LANE_BYTES_PER_S[(self.generation.clamp(1, 5) - 1) as usize];
        lane * f64::from(self.width) * EFFICIENCY
    }

    /// How long moving `bytes` over this link takes, in ns.
    pub fn copy_ns(self, bytes: u64) -> u64 {
        (bytes as f64 * 1e9 / self.bytes_per_s()).round() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_validates_links() {
        assert_eq!(PcieLink::parse("3,4"), Ok(PcieLink::new(3, 4).unwrap()));
        assert_eq!(PcieLink::parse(" 5 , 16 "), Ok(PcieLink::MAX));
        assert!(PcieLink::parse("6,16").is_err());
        assert!(PcieLink::parse("4,3").is_err());
        assert!(PcieLink::parse("4,32").is_err());
        assert!(PcieLink::parse("4").is_err());
        assert!(PcieLink::parse("x,4").is_err());
    }

    #[test]
    fn copy_time_follows_generation_and_width() {
        // Gen3 x4: 0.985 GB/s * 4 * 0.8 = 3.152 GB/s, so 64 MiB take 21.29 ms.
        let slow = PcieLink::new(3, 4).unwrap();
        assert_eq!(slow.copy_ns(64 << 20), 21_290_883);
        // Gen5 x16 is 0.8 * 16 * 3.938 GB/s = 50.4 GB/s.
        assert!((PcieLink::MAX.bytes_per_s() - 50.4064e9).abs() < 1e3);
        assert_eq!(PcieLink::MAX.copy_ns(0), 0);
    }
}
