//! Samples and block IOs by time: what ran, waited on IO or hit the disk between two instants,
//! the evidence behind a labelled window.
//!
//! An hour-long recording holds millions of these, so they are stored compactly: grouped in
//! buckets of 2^30 ns (about a second), each entry keeping only its offset inside its bucket.
//! A window query visits just the buckets it overlaps, so nothing is ever sorted. What
//! repeats across events (a thread with its stack, a thread with its direction of IO) is
//! interned once as a site, and each event keeps the site's number. Off-CPU samples are kept
//! only when they waited on IO: no label draws on the others by time.
use std::collections::BTreeMap;

const BUCKET_SHIFT: u32 = 30;
const OFFSET_MASK: u64 = (1 << BUCKET_SHIFT) - 1;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimedCpuSample {
    pub ts_ns: u64,
    pub tid: u32,
    pub stack: u32,
}

/// An off-CPU sample of a thread waiting on IO.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimedIoWait {
    pub ts_ns: u64,
    pub duration_ns: u64,
    pub tid: u32,
    pub stack: u32,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TimedBlockIo {
    pub ts_ns: u64,
    pub tid: u32,
    pub write: bool,
    pub bytes: u64,
    pub latency_ns: u64,
}

/// A u64 as two u32 halves: entries then align to 4 bytes, not 8, and carry no padding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Split([u32; 2]);

impl Split {
    fn new(v: u64) -> Self {
        Self([v as u32, (v >> 32) as u32])
    }

    fn get(self) -> u64 {
        u64::from(self.0[0]) | (u64::from(self.0[1]) << 32)
    }
}

/// An event as stored: its offset inside its bucket, and the rest of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamped<P> {
    offset: u32,
    payload: P,
}

/// A CPU sample: its (thread, stack) site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct CpuPayload {
    site: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IoWaitPayload {
    /// Its (thread, stack) site.
    site: u32,
    duration_ns: Split,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct BlockPayload {
    /// Its (thread, write) site.
    site: u32,
    bytes: Split,
    latency_ns: Split,
}

/// Values interned by number, in the order first seen.
#[derive(Clone, Debug)]
struct Sites<K> {
    values: Vec<K>,
    /// Dropped when the events are finished: lookups by number need only `values`.
    numbers: crate::fxhash::FxHashMap<K, u32>,
}

/// The numbers follow from the values.
impl<K: PartialEq> PartialEq for Sites<K> {
    fn eq(&self, other: &Self) -> bool {
        self.values == other.values
    }
}

impl<K> Default for Sites<K> {
    fn default() -> Self {
        Self {
            values: Vec::new(),
            numbers: Default::default(),
        }
    }
}

impl<K: Copy + Eq + std::hash::Hash> Sites<K> {
    fn number(&mut self, key: K) -> u32 {
        let next = self.values.len() as u32;
        let n = *self.numbers.entry(key).or_insert(next);
        if n == next {
            self.values.push(key);
        }
        n
    }

    fn get(&self, n: u32) -> K {
        self.values[n as usize]
    }

    fn finish(&mut self) {
        self.numbers = Default::default();
        self.values.shrink_to_fit();
    }
}

/// Buckets kept open at once. Records arrive almost in time order, but samples from different
/// CPUs interleave: events near a bucket's edge alternate between two buckets.
const OPEN_BUCKETS: usize = 4;

/// Entries by bucket. Pushes go to a few open buckets kept outside the map; the oldest is
/// closed into the map when another one opens.
#[derive(Clone, Debug, PartialEq)]
struct Buckets<P> {
    closed: BTreeMap<u64, Vec<Stamped<P>>>,
    open: Vec<(u64, Vec<Stamped<P>>)>,
    /// The last closed bucket's length: the next one is likely about as full.
    last_len: usize,
}

impl<P> Default for Buckets<P> {
    fn default() -> Self {
        Self {
            closed: BTreeMap::new(),
            open: Vec::new(),
            last_len: 0,
        }
    }
}

impl<P: Copy> Buckets<P> {
    fn push(&mut self, ts_ns: u64, payload: P) {
        let (bucket, offset) = (ts_ns >> BUCKET_SHIFT, (ts_ns & OFFSET_MASK) as u32);
        let entry = Stamped { offset, payload };
        if let Some((_, entries)) = self.open.iter_mut().find(|(b, _)| *b == bucket) {
            entries.push(entry);
            return;
        }
        if self.open.len() == OPEN_BUCKETS {
            let oldest = (0..self.open.len())
                .min_by_key(|&i| self.open[i].0)
                .unwrap_or(0);
            let (b, entries) = self.open.swap_remove(oldest);
            self.close(b, entries);
        }
        let mut entries = self
            .closed
            .remove(&bucket)
            .unwrap_or_else(|| Vec::with_capacity(self.last_len + self.last_len / 8 + 1));
        entries.push(entry);
        self.open.push((bucket, entries));
    }

    fn close(&mut self, bucket: u64, mut entries: Vec<Stamped<P>>) {
        self.last_len = entries.len();
        entries.shrink_to_fit();
        self.closed.insert(bucket, entries);
    }

    fn close_all(&mut self) {
        for (bucket, entries) in std::mem::take(&mut self.open) {
            self.close(bucket, entries);
        }
    }

    fn len(&self) -> usize {
        let open: usize = self.open.iter().map(|(_, e)| e.len()).sum();
        open + self.closed.values().map(Vec::len).sum::<usize>()
    }

    /// The start of the first bucket and the end of the last, if any event was pushed.
    fn bounds(&self) -> Option<(u64, u64)> {
        let first = self.closed.keys().next()?;
        let last = self.closed.keys().next_back()?;
        Some((first << BUCKET_SHIFT, (last + 1) << BUCKET_SHIFT))
    }

    /// (time, payload) of the events in `[start, end)`, in no particular order.
    fn window(&self, start: u64, end: u64) -> impl Iterator<Item = (u64, P)> + '_ {
        debug_assert!(self.open.is_empty(), "query before finish");
        let buckets = (end > start).then(|| {
            self.closed
                .range(start >> BUCKET_SHIFT..=(end - 1) >> BUCKET_SHIFT)
        });
        buckets
            .into_iter()
            .flatten()
            .flat_map(move |(&bucket, entries)| {
                let base = bucket << BUCKET_SHIFT;
                entries
                    .iter()
                    .map(move |e| (base + u64::from(e.offset), e.payload))
            })
            .filter(move |(ts, _)| (start..end).contains(ts))
    }
}

/// A sum per site, for the sites touched.
struct SiteTotals {
    sums: Vec<u64>,
    touched: Vec<u32>,
}

impl SiteTotals {
    fn new(sites: usize) -> Self {
        Self {
            sums: vec![0; sites],
            touched: Vec::new(),
        }
    }

    fn add(&mut self, site: u32, value: u64) {
        let Some(sum) = self.sums.get_mut(site as usize) else {
            return;
        };
        if *sum == 0 {
            self.touched.push(site);
        }
        // Saturating: durations come from a file, which may be damaged. A sum stuck at 0
        // (adding zeros) may list its site twice; `resolve` skips the zeros.
        *sum = sum.saturating_add(value);
    }

    fn resolve(self, sites: &Sites<(u32, u32)>) -> Vec<(u32, u32, u64)> {
        let mut seen = self.sums;
        self.touched
            .into_iter()
            .filter_map(|site| {
                let sum = std::mem::take(&mut seen[site as usize]);
                (sum > 0).then(|| {
                    let (tid, stack) = sites.get(site);
                    (tid, stack, sum)
                })
            })
            .collect()
    }
}

/// The CPU samples alone, as [`TimedEvents`] stores them: what the timeline keeps once the
/// attribution is done, without copying millions of samples out.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuSamples {
    cpu: Buckets<CpuPayload>,
    stacks: Sites<(u32, u32)>,
}

impl CpuSamples {
    pub fn len(&self) -> usize {
        self.cpu.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every sample, bucket by bucket (about a second each) in time order; in a bucket, in
    /// the order they were read.
    pub fn iter(&self) -> impl Iterator<Item = TimedCpuSample> + '_ {
        self.cpu.window(0, u64::MAX).map(|(ts_ns, p)| {
            let (tid, stack) = self.stacks.get(p.site);
            TimedCpuSample { ts_ns, tid, stack }
        })
    }

    /// Keeps the samples of the threads `keep` accepts, asked once per (thread, stack) site.
    pub fn retain_threads(&mut self, keep: impl Fn(u32) -> bool) {
        let kept: Vec<bool> = self.stacks.values.iter().map(|&(t, _)| keep(t)).collect();
        for entries in self.cpu.closed.values_mut() {
            entries.retain(|e| kept[e.payload.site as usize]);
        }
        self.cpu.closed.retain(|_, entries| !entries.is_empty());
    }
}

/// Samples and IOs with their times.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TimedEvents {
    cpu: Buckets<CpuPayload>,
    io_wait: Buckets<IoWaitPayload>,
    block_io: Buckets<BlockPayload>,
    /// (thread, stack) of the CPU and IO-wait samples.
    stacks: Sites<(u32, u32)>,
    /// (thread, write) of the block IOs.
    issuers: Sites<(u32, bool)>,
}

impl TimedEvents {
    pub fn cpu_sample(&mut self, ts_ns: u64, tid: u32, stack: u32) {
        let site = self.stacks.number((tid, stack));
        self.cpu.push(ts_ns, CpuPayload { site });
    }

    /// Only samples that waited on IO are kept.
    pub fn off_cpu_sample(&mut self, ts_ns: u64, tid: u32, stack: u32, io: bool, duration_ns: u64) {
        if !io {
            return;
        }
        let payload = IoWaitPayload {
            site: self.stacks.number((tid, stack)),
            duration_ns: Split::new(duration_ns),
        };
        self.io_wait.push(ts_ns, payload);
    }

    pub fn block_io(&mut self, ts_ns: u64, tid: u32, write: bool, bytes: u64, latency_ns: u64) {
        let payload = BlockPayload {
            site: self.issuers.number((tid, write)),
            bytes: Split::new(bytes),
            latency_ns: Split::new(latency_ns),
        };
        self.block_io.push(ts_ns, payload);
    }

    /// The CPU samples, the rest dropped.
    pub fn into_cpu_samples(self) -> CpuSamples {
        CpuSamples {
            cpu: self.cpu,
            stacks: self.stacks,
        }
    }

    /// Closes the buckets still open; queries need this first.
    pub fn finish(&mut self) {
        self.cpu.close_all();
        self.io_wait.close_all();
        self.block_io.close_all();
        self.stacks.finish();
        self.issuers.finish();
    }

    /// Held events: (CPU samples, IO-wait samples, block IOs).
    pub fn len(&self) -> (usize, usize, usize) {
        (self.cpu.len(), self.io_wait.len(), self.block_io.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == (0, 0, 0)
    }

    /// Per (thread, stack), the CPU samples taken inside `ranges` (which must not overlap, or
    /// a sample counts twice): (tid, stack, samples), in no particular order. Summed per site
    /// before the site is looked up, since an hour's window holds millions of samples and
    /// thousands of sites.
    pub fn cpu_totals_in(&self, ranges: &[(u64, u64)]) -> Vec<(u32, u32, u64)> {
        let mut totals = SiteTotals::new(self.stacks.values.len());
        for &(start, end) in ranges {
            for (_, p) in self.cpu.window(start, end) {
                totals.add(p.site, 1);
            }
        }
        totals.resolve(&self.stacks)
    }

    /// As [`TimedEvents::cpu_totals_in`], for the IO-wait samples: (tid, stack, ns waited).
    pub fn io_wait_totals_in(&self, ranges: &[(u64, u64)]) -> Vec<(u32, u32, u64)> {
        let mut totals = SiteTotals::new(self.stacks.values.len());
        for &(start, end) in ranges {
            for (_, p) in self.io_wait.window(start, end) {
                totals.add(p.site, p.duration_ns.get());
            }
        }
        totals.resolve(&self.stacks)
    }

    /// CPU samples taken in `[start, end)`, in no particular order.
    pub fn cpu_in(&self, start: u64, end: u64) -> impl Iterator<Item = TimedCpuSample> + '_ {
        self.cpu.window(start, end).map(|(ts_ns, p)| {
            let (tid, stack) = self.stacks.get(p.site);
            TimedCpuSample { ts_ns, tid, stack }
        })
    }

    /// IO-wait samples taken in `[start, end)`, in no particular order.
    pub fn io_wait_in(&self, start: u64, end: u64) -> impl Iterator<Item = TimedIoWait> + '_ {
        self.io_wait.window(start, end).map(|(ts_ns, p)| {
            let (tid, stack) = self.stacks.get(p.site);
            TimedIoWait {
                ts_ns,
                duration_ns: p.duration_ns.get(),
                tid,
                stack,
            }
        })
    }

    /// A span holding every block IO's time, if there is any.
    pub fn block_io_bounds(&self) -> Option<(u64, u64)> {
        self.block_io.bounds()
    }

    /// Block IOs issued in `[start, end)`, in no particular order.
    pub fn block_io_in(&self, start: u64, end: u64) -> impl Iterator<Item = TimedBlockIo> + '_ {
        self.block_io.window(start, end).map(|(ts_ns, p)| {
            let (tid, write) = self.issuers.get(p.site);
            TimedBlockIo {
                ts_ns,
                tid,
                write,
                bytes: p.bytes.get(),
                latency_ns: p.latency_ns.get(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted<T: Ord>(mut v: Vec<T>) -> Vec<T> {
        v.sort();
        v
    }

    #[test]
    fn windows_cut_at_their_edges_across_buckets_and_out_of_order_pushes() {
        let mut t = TimedEvents::default();
        let b = 1u64 << BUCKET_SHIFT;
        // Out of order, across three buckets, with one bucket revisited after another opened.
        let times = [5 * b + 10, 5 * b - 1, 6 * b, 5 * b, 7 * b + 3, 5 * b + 11];
        for (i, &ts) in times.iter().enumerate() {
            t.cpu_sample(ts, i as u32, 100 + i as u32);
        }
        t.finish();
        let got = |s, e| sorted(t.cpu_in(s, e).map(|x| (x.ts_ns, x.tid)).collect());
        assert_eq!(
            got(0, u64::MAX),
            sorted(
                times
                    .iter()
                    .enumerate()
                    .map(|(i, &ts)| (ts, i as u32))
                    .collect()
            )
        );
        assert_eq!(got(5 * b, 5 * b + 11), vec![(5 * b, 3), (5 * b + 10, 0)]);
        assert_eq!(
            got(5 * b - 1, 6 * b + 1),
            vec![
                (5 * b - 1, 1),
                (5 * b, 3),
                (5 * b + 10, 0),
                (5 * b + 11, 5),
                (6 * b, 2)
            ]
        );
        assert_eq!(got(6 * b + 1, 7 * b + 3), vec![]);
        assert_eq!(got(7 * b + 3, 7 * b + 3), vec![]);
        assert_eq!(t.len(), (6, 0, 0));
    }

    #[test]
    fn the_cpu_samples_kept_alone_are_the_samples_in_time_order_less_the_threads_left_out() {
        let mut t = TimedEvents::default();
        let b = 1u64 << BUCKET_SHIFT;
        // Out of order across buckets, as CPUs interleave; one thread alone in a bucket.
        for i in (0..2000u64).rev() {
            t.cpu_sample(i * b / 400, (i % 4) as u32, (i % 5) as u32);
        }
        t.cpu_sample(9 * b, 3, 1);
        t.block_io(7, 1, false, 4096, 10);
        t.finish();
        let all: Vec<TimedCpuSample> = t.cpu_in(0, u64::MAX).collect();
        let mut samples = t.into_cpu_samples();
        assert_eq!(samples.iter().collect::<Vec<_>>(), all);
        assert_eq!(samples.len(), 2001);
        samples.retain_threads(|tid| tid != 3);
        let kept: Vec<TimedCpuSample> = all.iter().copied().filter(|s| s.tid != 3).collect();
        assert_eq!(samples.iter().collect::<Vec<_>>(), kept);
        assert_eq!(samples.len(), 1500);
        assert!(
            kept.windows(2)
                .all(|w| w[0].ts_ns >> BUCKET_SHIFT <= w[1].ts_ns >> BUCKET_SHIFT),
            "buckets in time order"
        );
        samples.retain_threads(|_| false);
        assert!(samples.is_empty());
    }

    #[test]
    fn totals_per_thread_and_stack_over_ranges_match_the_samples_one_by_one() {
        let mut t = TimedEvents::default();
        let b = 1u64 << BUCKET_SHIFT;
        for i in 0..3000u64 {
            let (tid, stack) = ((i % 3) as u32, (i % 7) as u32);
            t.cpu_sample(i * b / 1000, tid, stack);
            t.off_cpu_sample(i * b / 1000 + 1, tid, stack, i % 2 == 0, i);
        }
        t.off_cpu_sample(5, 9, 9, true, u64::MAX);
        t.off_cpu_sample(6, 9, 9, true, u64::MAX);
        t.finish();
        let ranges = [(0, 7), (b / 2, b + 17), (2 * b, 2 * b + b / 3)];
        let by_hand = |io: bool| {
            let mut m: BTreeMap<(u32, u32), u64> = BTreeMap::new();
            for &(s, e) in &ranges {
                if io {
                    for x in t.io_wait_in(s, e) {
                        let v = m.entry((x.tid, x.stack)).or_default();
                        *v = v.saturating_add(x.duration_ns);
                    }
                } else {
                    for x in t.cpu_in(s, e) {
                        *m.entry((x.tid, x.stack)).or_default() += 1;
                    }
                }
            }
            m.retain(|_, v| *v > 0);
            m
        };
        let keyed = |v: Vec<(u32, u32, u64)>| -> BTreeMap<(u32, u32), u64> {
            let n = v.len();
            let m: BTreeMap<_, _> = v.into_iter().map(|(a, b, c)| ((a, b), c)).collect();
            assert_eq!(m.len(), n, "each site once");
            m
        };
        let cpu = keyed(t.cpu_totals_in(&ranges));
        assert_eq!(cpu, by_hand(false));
        assert!(cpu.len() > 10);
        let io = keyed(t.io_wait_totals_in(&ranges));
        assert_eq!(io, by_hand(true));
        assert_eq!(io[&(9, 9)], u64::MAX, "saturates");
        assert!(t.cpu_totals_in(&[]).is_empty());
    }

    #[test]
    fn keeps_io_waits_only_and_full_width_values() {
        let mut t = TimedEvents::default();
        t.off_cpu_sample(10, 1, 2, true, u64::MAX - 1);
        t.off_cpu_sample(11, 1, 3, false, 5);
        t.block_io(12, 4, true, 1 << 40, 3 << 33);
        t.finish();
        let io: Vec<_> = t.io_wait_in(0, 100).collect();
        assert_eq!(
            io,
            [TimedIoWait {
                ts_ns: 10,
                duration_ns: u64::MAX - 1,
                tid: 1,
                stack: 2
            }]
        );
        let blk: Vec<_> = t.block_io_in(0, 100).collect();
        assert_eq!(
            blk,
            [TimedBlockIo {
                ts_ns: 12,
                tid: 4,
                write: true,
                bytes: 1 << 40,
                latency_ns: 3 << 33
            }]
        );
    }

    #[test]
    fn extreme_timestamps_cost_two_buckets_not_a_range() {
        let mut t = TimedEvents::default();
        t.cpu_sample(0, 1, 1);
        t.cpu_sample(u64::MAX, 2, 2);
        t.finish();
        assert_eq!(t.cpu.closed.len(), 2);
        assert_eq!(t.cpu_in(0, u64::MAX).count(), 1);
        assert_eq!(t.cpu_in(1, u64::MAX).count(), 0);
    }

    #[test]
    fn entries_stay_compact() {
        assert_eq!(std::mem::size_of::<Stamped<CpuPayload>>(), 8);
        assert_eq!(std::mem::size_of::<Stamped<IoWaitPayload>>(), 16);
        assert_eq!(std::mem::size_of::<Stamped<BlockPayload>>(), 24);
    }
}
