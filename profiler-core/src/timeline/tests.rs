//! The lanes of real recordings (stallgen on the simulated GPU) against the report's own
//! totals.
use super::*;
use crate::attribution::attribute;

const DDP: &[u8] = include_bytes!("../../tests/recordings/gpu/v1-nccl-straggler-ddp.rec");
const DISK: &[u8] = include_bytes!("../../tests/recordings/gpu/v1-disk.rec");

fn lanes_of(bytes: &[u8], check: impl Fn(&Analysis, &Attribution, &RecordingLanes<'_>)) {
    let (folded, _) = crate::load_reader(bytes).unwrap();
    let attribution = attribute(&folded.analysis, &folded.timed).unwrap();
    let events = TimelineEvents::keep(folded.timed.clone(), 50_000_000);
    let lanes = build("r.rec", &folded.analysis, Some(&attribution), events);
    check(&folded.analysis, &attribution, &lanes);
}

fn disjoint(lane: &[Slice]) -> bool {
    lane.windows(2)
        .all(|w| w[0].end_ns <= w[1].start_ns && w[0].start_ns <= w[0].end_ns)
}

#[test]
fn idle_slices_add_up_to_the_idle_time_by_cause_and_waiting_to_waiting() {
    for bytes in [DDP, DISK] {
        lanes_of(bytes, |_, attribution, lanes| {
            for ga in &attribution.gpus {
                let g = lanes.gpus.iter().find(|g| g.index == ga.gpu).unwrap();
                let mut by_cause: BTreeMap<Cause, u64> = BTreeMap::new();
                let mut waiting = 0;
                for (lost, cause, s) in &g.lost {
                    match lost {
                        Lost::Idle => *by_cause.entry(*cause).or_default() += s.dur_ns(),
                        Lost::Waiting => waiting += s.dur_ns(),
                    }
                }
                let mut want = ga.idle_by_cause.clone();
                want.retain(|_, ns| *ns > 0);
                assert_eq!(by_cause, want, "GPU {}", ga.gpu);
                assert_eq!(waiting, ga.waiting_ns, "GPU {}", ga.gpu);
                let slices: Vec<Slice> = g.lost.iter().map(|(_, _, s)| s.clone()).collect();
                assert!(disjoint(&slices), "GPU {} lost time overlaps", ga.gpu);
                assert_eq!(g.util.len(), ga.labels.len().max(g.util.len()));
                assert_eq!(g.stalls.len(), ga.stalls.len());
            }
        });
    }
}

#[test]
fn each_threads_states_add_up_to_its_counters_and_never_overlap() {
    for bytes in [DDP, DISK] {
        lanes_of(bytes, |a, _, lanes| {
            let mut threads = 0;
            for p in &lanes.processes {
                for t in &p.threads {
                    let c = &a.threads[&t.tid].counters;
                    let sum = |st: ThreadState| -> u64 {
                        t.states
                            .iter()
                            .filter(|s| s.state == st)
                            .map(StateRun::dur_ns)
                            .sum()
                    };
                    assert_eq!(sum(ThreadState::OnCpu), c.on_cpu_ns, "tid {}", t.tid);
                    assert_eq!(sum(ThreadState::RunQueue), c.runqueue_ns, "tid {}", t.tid);
                    assert_eq!(sum(ThreadState::IoWait), c.io_wait_ns, "tid {}", t.tid);
                    assert_eq!(sum(ThreadState::Blocked), c.blocked_ns, "tid {}", t.tid);
                    assert!(
                        t.states.windows(2).all(|w| w[0].end_ns <= w[1].start_ns),
                        "tid {}",
                        t.tid
                    );
                    for lane in t.cuda.iter().chain(&t.block_io) {
                        assert!(disjoint(lane), "tid {}", t.tid);
                    }
                    threads += 1;
                }
                for lane in &p.collectives {
                    assert!(disjoint(lane), "pid {}", p.pid);
                }
            }
            assert_eq!(threads, a.threads.len());
        });
    }
}

#[test]
fn calls_collectives_ios_and_samples_are_all_drawn() {
    lanes_of(DDP, |a, _, lanes| {
        let calls: usize = lanes
            .processes
            .iter()
            .flat_map(|p| &p.threads)
            .flat_map(|t| &t.cuda)
            .map(Vec::len)
            .sum();
        assert_eq!(calls, a.cuda.calls.len());
        let collectives: usize = lanes
            .processes
            .iter()
            .flat_map(|p| &p.collectives)
            .map(Vec::len)
            .sum();
        assert_eq!(collectives, a.cuda.collectives.len());
        assert!(collectives > 0);
        let ranks = lanes
            .processes
            .iter()
            .filter(|p| !p.collectives.is_empty())
            .count();
        assert_eq!(ranks, 4);
        let samples: u64 = a.cpu_samples.iter().map(|s| s.samples).sum();
        assert_eq!(lanes.samples.len() as u64, samples);
    });
    lanes_of(DISK, |a, _, lanes| {
        let ios: usize = lanes
            .processes
            .iter()
            .flat_map(|p| &p.threads)
            .flat_map(|t| &t.block_io)
            .map(Vec::len)
            .sum();
        let counted: u64 = a.threads.values().map(|t| t.block_io.count).sum();
        assert_eq!(ios as u64, counted);
        assert!(ios > 0);
    });
}

#[test]
fn past_the_limit_block_ios_group_per_thread_tick_and_kind_in_time_order() {
    use crate::analysis::timed_events::TimedEvents;
    let tick = 50_000_000u64;
    let mut timed = TimedEvents::default();
    // Out of order, over minutes (many grouping windows), two threads, reads and writes.
    let n = MAX_BLOCK_IO_SLICES as u64 + 1000;
    for i in 0..n {
        let k = (i * 7919) % n;
        let ts = 1_000_000_000 + k * 997_003;
        timed.block_io(ts, 1 + (k % 2) as u32, k.is_multiple_of(3), 4096, 100_000);
    }
    timed.finish();
    let kept = TimelineEvents::keep(timed, tick);
    assert!(kept.block_io.len() < n as usize);
    assert_eq!(
        kept.block_io.iter().map(|g| g.requests).sum::<u64>(),
        n,
        "every IO is in a group"
    );
    let mut seen = std::collections::BTreeSet::new();
    for g in &kept.block_io {
        assert!(
            seen.insert((g.tid, g.end_ns / tick, g.write)),
            "a (thread, tick, kind) is one group, not cut in two"
        );
    }
    for tid in [1, 2] {
        let ends: Vec<u64> = kept
            .block_io
            .iter()
            .filter(|g| g.tid == tid && !g.write)
            .map(|g| g.end_ns)
            .collect();
        assert!(
            ends.windows(2).all(|w| w[0] < w[1]),
            "time order per thread"
        );
    }
}
