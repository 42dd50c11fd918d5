//! User space's side of the tracked-thread table: seeds it before the programs attach and
//! reads it on every tick.
//!
//! The kernel keeps each tracked thread's accounting in an entry of the `SLOTS` array, found
//! through the per-TID lanes of `TRACKED` (see `profiler-ebpf/src/maps.rs`); a fork takes a
//! free slot number from the `FREE_SLOTS` stack and an exit gives it back. The stack keeps
//! the slots in use the lowest ones, so a tick reads entries up to the highest slot handed
//! out, which the `THREAD_NEW` records report. A record the ring buffer refused hides its
//! slot; but never-used slots come off the stack in ascending order, so each refused fork
//! raises the highest slot by one at most, and the bound grows by one per refusal.
use anyhow::Context as _;
use aya::maps::{Array, MapData, PerCpuArray, Stack};
use profiler_common::{EventCounts, MAX_SLOTS, TIDS_PER_ELEMENT, ThreadStats, kind};

use crate::capture::proc::target::SeedThread;

fn take<T>(ebpf: &mut aya::Ebpf, name: &str) -> anyhow::Result<T>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| anyhow::anyhow!("map {name} missing"))?;
    Ok(T::try_from(map)?)
}

pub struct Slots {
    table: Array<MapData, ThreadStats>,
    /// Entries that may be in use: at least the highest slot number handed out so far.
    high: u32,
    /// Entries in the table.
    capacity: u32,
    /// `THREAD_NEW` refusals already added to `high`.
    refused: u64,
}

impl Slots {
    /// Writes the seeded threads' entries and lanes, then fills the free stack with every
    /// other slot number, the lowest on top. The programs must not be attached yet.
    pub fn seed(
        ebpf: &mut aya::Ebpf,
        capacity: u32,
        seeds: &[SeedThread],
        entry: impl Fn(&SeedThread) -> ThreadStats,
    ) -> anyhow::Result<Self> {
        let capacity = capacity.min(MAX_SLOTS);
        if seeds.len() > capacity as usize {
            anyhow::bail!(
                "the target has {} threads, more than --max-threads ({capacity})",
                seeds.len()
            );
        }
        let mut table: Array<MapData, ThreadStats> = take(ebpf, "SLOTS")?;
        // Only written here: the programs hold the maps, so what is written outlives these
        // handles.
        let mut lanes: Array<MapData, [u16; TIDS_PER_ELEMENT as usize]> = take(ebpf, "TRACKED")?;
        let mut free: Stack<MapData, u32> = take(ebpf, "FREE_SLOTS")?;
        for (index, s) in seeds.iter().enumerate() {
            let slot = index as u32 + 1;
            let mut st = entry(s);
            st.tid = s.tid;
            table
                .set(index as u32, st, 0)
                .with_context(|| format!("seeding thread {}", s.tid))?;
            let element = s.tid / TIDS_PER_ELEMENT;
            let mut four = lanes.get(&element, 0).with_context(|| {
                format!("thread {} is past the kernel's pid_max at load", s.tid)
            })?;
            four[(s.tid % TIDS_PER_ELEMENT) as usize] = slot as u16;
            lanes
                .set(element, four, 0)
                .with_context(|| format!("flagging thread {}", s.tid))?;
        }
        for slot in (seeds.len() as u32 + 1..=capacity).rev() {
            free.push(slot, 0).context("filling the free-slot stack")?;
        }
        Ok(Self {
            table,
            high: seeds.len() as u32,
            capacity,
            refused: 0,
        })
    }

    /// A slot number a `THREAD_NEW` record reported.
    pub fn handed_out(&mut self, slot: u32) {
        self.high = self.high.max(slot.min(self.capacity));
    }

    /// Every tracked thread's TID and accounting, read now. `counts` is the kernel's
    /// per-kind event counters.
    pub fn read(
        &mut self,
        counts: &PerCpuArray<&MapData, EventCounts>,
    ) -> anyhow::Result<Vec<(u32, ThreadStats)>> {
        let refused: u64 = counts
            .get(&kind::THREAD_NEW, 0)?
            .iter()
            .map(|c| c.dropped)
            .sum();
        let unseen = refused.saturating_sub(self.refused);
        self.refused = refused;
        self.high = (u64::from(self.high) + unseen).min(u64::from(self.capacity)) as u32;
        Ok((0..self.high)
            .filter_map(|index| self.table.get(&index, 0).ok())
            .filter(|st| st.tid != 0)
            .map(|st| (st.tid, st))
            .collect())
    }
}
