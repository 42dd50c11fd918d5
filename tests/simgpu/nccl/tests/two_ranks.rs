//! Two ranks in two processes, each on its own simulated GPU, through the simulated
//! libnccl.so.2: a collective only queues work, a rank's stream waits until the slowest rank
//! gets there (with the GPU busy by default, idle with `STALLSCOPE_SIMGPU_NCCL_WAIT=idle`), a
//! collective on its own stream runs beside compute kernels, and grouped sends and receives
//! pair up.
//!
//! Needs the built libraries: `cargo build --release -p simgpu-cuda -p simgpu-nvml
//! -p simgpu-nccl` first.
mod common;

use std::ffi::CStr;
use std::process::Output;
use std::time::Instant;

use common::api::{Api, FLOAT32, Rank, SUM, nccl_ok};
use common::{MS, Machine, as_child, reported, run_ranks, straggle};
use simgpu_state::clock::monotonic_ns;
use simgpu_state::window::share_of;

/// How long rank 1 dawdles before its all-reduce.
const STRAGGLE_MS: u64 = 600;
/// Each rank's compute before the all-reduce.
const KERNEL_MS: u64 = 200;
/// Floats all-reduced: 16 MiB.
const COUNT: usize = 4 << 20;
/// SM shares: compute kernels' and the comm kernel's defaults.
const COMPUTE_SHARE: u32 = 90;
const COMM_SHARE: u32 = 15;

/// Busy and SM-active ns of GPU `gpu` so far, read from the state file.
fn gpu_totals(state: &std::path::Path, gpu: u32) -> (u64, u64) {
    let state = simgpu_state::SharedState::open(state, Default::default()).unwrap();
    let totals = state.device(gpu).unwrap().totals();
    (totals.busy_ns, totals.sm_active_ns)
}

/// The ranks of the all-reduce tests: rank 1 straggles, then each runs a kernel and an
/// all-reduce on one stream and syncs it; each reports what it saw.
fn all_reduce_ranks(name: &str) -> bool {
    as_child(name, |c| {
        let api = Api::load(&c.lib_dir);
        let rank = Rank::open(&api, c.rank as i32, COUNT * 4);
        let comm = rank.comm(2, common::api::UniqueId(c.id), c.rank as i32);
        let before = gpu_totals(&c.state, c.rank as u32);
        if c.rank == 1 {
            straggle(STRAGGLE_MS);
        }
        rank.kernel(KERNEL_MS * MS);
        let t = Instant::now();
        rank.all_reduce(comm, COUNT);
        let enqueue_ns = t.elapsed().as_nanos();
        rank.sync();
        let sync_ns = t.elapsed().as_nanos();
        let done_ns = monotonic_ns();
        let after = gpu_totals(&c.state, c.rank as u32);
        let (busy_ns, sm_ns) = (after.0 - before.0, after.1 - before.1);
        println!(
            "report enqueue_ns={enqueue_ns} sync_ns={sync_ns} done_ns={done_ns} \
             busy_ns={busy_ns} sm_ns={sm_ns}"
        );
        // SAFETY: our communicator.
        nccl_ok(unsafe { (api.ncclCommDestroy)(comm) }, "ncclCommDestroy");
    })
}

/// Shows each rank's report line (on stderr, for a failing assertion's context).
fn print_reports(out: &[Output]) {
    for (r, o) in out.iter().enumerate() {
        let text = String::from_utf8_lossy(&o.stdout);
        let line = text
            .lines()
            .find(|l| l.contains("report"))
            .unwrap_or_default();
        eprintln!("rank {r}: {line}");
    }
}

/// Runs the all-reduce ranks with `env` and checks what holds in both wait modes: the calls
/// only queue, rank 0's sync sees the whole wait, rank 1 finds rank 0 waiting, both finish
/// together, and the rendezvous file is gone.
fn run_all_reduce(name: &str, machine: &Machine, env: &[(&str, &str)]) -> Vec<Output> {
    let id = Api::load(&machine.lib_dir).unique_id();
    let mut env = env.to_vec();
    env.push(("STALLSCOPE_SIMGPU_DEVICES", "2"));
    let out = run_ranks(name, machine, 2, &id.0, &env);
    print_reports(&out);
    let get = |r: usize, k: &str| reported(&out[r], "report", k);
    for r in 0..2 {
        assert!(
            get(r, "enqueue_ns") < 50 * MS,
            "ncclAllReduce only queues: rank {r} took {} ns",
            get(r, "enqueue_ns")
        );
    }
    // Rank 0's stream reached the all-reduce after its kernel and waited for rank 1's, which
    // came STRAGGLE_MS later: its sync saw the whole wait.
    let waited = get(0, "sync_ns");
    assert!(
        waited >= (STRAGGLE_MS + KERNEL_MS - 80) * MS,
        "rank 0 synced after {waited} ns"
    );
    assert!(
        get(1, "sync_ns") < (KERNEL_MS + 150) * MS,
        "rank 1 found rank 0 waiting: {} ns",
        get(1, "sync_ns")
    );
    let (d0, d1) = (get(0, "done_ns"), get(1, "done_ns"));
    assert!(d0.abs_diff(d1) < 60 * MS, "ranks finished {d0} and {d1}");
    assert!(!machine.root.read_dir().unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("simgpu-nccl-")
    }));
    out
}

/// The default, as on real hardware: NCCL's kernel spins while it waits, so the waiting rank's
/// GPU reads busy for the whole wait, and GPM's SM activity shows how little ran meanwhile.
#[test]
fn all_reduce_waits_busy_for_the_slowest_rank() {
    let name = "all_reduce_waits_busy_for_the_slowest_rank";
    if all_reduce_ranks(name) {
        return;
    }
    let machine = Machine::new("straggler-busy");
    let out = run_all_reduce(name, &machine, &[]);
    let get = |r: usize, k: &str| reported(&out[r], "report", k);
    let (waited, busy0, sm0) = (get(0, "sync_ns"), get(0, "busy_ns"), get(0, "sm_ns"));
    assert!(
        busy0.abs_diff(waited) < 60 * MS,
        "GPU 0 was busy {busy0} ns of a {waited} ns kernel and wait"
    );
    // The kernel at 90% of the SMs, the comm kernel's wait and transfer at 15%.
    let expected =
        share_of(KERNEL_MS * MS, COMPUTE_SHARE) + share_of(busy0 - KERNEL_MS * MS, COMM_SHARE);
    assert!(
        sm0.abs_diff(expected) < 20 * MS,
        "GPU 0 was SM-active {sm0} ns, expected {expected}"
    );
    // Rank 1 did not wait: busy for its kernel and the transfer only.
    let busy1 = get(1, "busy_ns");
    assert!(
        (KERNEL_MS * MS..(KERNEL_MS + 60) * MS).contains(&busy1),
        "GPU 1 was busy {busy1} ns"
    );
}

/// `STALLSCOPE_SIMGPU_NCCL_WAIT=idle`: the wait is a host function, so a straggler shows as GPU
/// idle time: the waiting GPU is busy only for its kernel and the transfer.
#[test]
fn all_reduce_waits_idle_when_told() {
    let name = "all_reduce_waits_idle_when_told";
    if all_reduce_ranks(name) {
        return;
    }
    let machine = Machine::new("straggler-idle");
    let out = run_all_reduce(name, &machine, &[("STALLSCOPE_SIMGPU_NCCL_WAIT", "idle")]);
    let get = |r: usize, k: &str| reported(&out[r], "report", k);
    let (waited, busy0) = (get(0, "sync_ns"), get(0, "busy_ns"));
    assert!(
        (KERNEL_MS * MS..(KERNEL_MS + 60) * MS).contains(&busy0),
        "GPU 0 was busy {busy0} ns of a {waited} ns wait"
    );
    // The transfer is a compute kernel here (ncclDevKernel_Generic), at the compute share.
    let sm0 = get(0, "sm_ns");
    assert!(
        sm0.abs_diff(share_of(busy0, COMPUTE_SHARE)) < MS,
        "GPU 0 was SM-active {sm0} ns of {busy0} ns busy"
    );
}

/// Compute before the bucket is ready, then the all-reduce on the NCCL stream.
const GRAD_MS: u64 = 200;
/// Backward compute that overlaps the all-reduce.
const OVERLAP_MS: u64 = 300;
/// The optimizer step, after the all-reduce.
const STEP_MS: u64 = 50;
/// Rank 1's lateness in the DDP test: rank 0's all-reduce waits well past its overlap kernel.
const LATE_MS: u64 = 500;

/// As PyTorch DDP does it: the all-reduce runs on its own NCCL stream after an event of the
/// compute stream, compute goes on beside it (the comm kernel is on its own engine and lane),
/// and the compute stream waits for the all-reduce's end event before the optimizer step.
#[test]
fn ddp_all_reduce_runs_beside_compute() {
    let name = "ddp_all_reduce_runs_beside_compute";
    if as_child(name, |c| {
        let api = Api::load(&c.lib_dir);
        let rank = Rank::open(&api, c.rank as i32, COUNT * 4);
        let comm = rank.comm(2, common::api::UniqueId(c.id), c.rank as i32);
        let (compute, nccl) = (rank.stream, rank.new_stream());
        let before = gpu_totals(&c.state, c.rank as u32);
        if c.rank == 1 {
            straggle(LATE_MS);
        }
        let start = rank.record(compute);
        rank.kernel_on(GRAD_MS * MS, compute);
        let grads = rank.record(compute);
        rank.wait_event(nccl, grads);
        rank.all_reduce_on(comm, COUNT, nccl);
        rank.kernel_on(OVERLAP_MS * MS, compute);
        let overlap = rank.record(compute);
        let reduced = rank.record(nccl);
        rank.wait_event(compute, reduced);
        rank.kernel_on(STEP_MS * MS, compute);
        let step = rank.record(compute);
        rank.sync();
        let after = gpu_totals(&c.state, c.rank as u32);
        let us = |e| rank.elapsed_us(start, e);
        println!(
            "report grads_us={} overlap_us={} reduced_us={} step_us={} busy_ns={} sm_ns={}",
            us(grads),
            us(overlap),
            us(reduced),
            us(step),
            after.0 - before.0,
            after.1 - before.1
        );
        // SAFETY: our communicator.
        nccl_ok(unsafe { (api.ncclCommDestroy)(comm) }, "ncclCommDestroy");
    }) {
        return;
    }
    let machine = Machine::new("ddp");
    let id = Api::load(&machine.lib_dir).unique_id();
    let env = [("STALLSCOPE_SIMGPU_DEVICES", "2")];
    let out = run_ranks(name, &machine, 2, &id.0, &env);
    print_reports(&out);
    let get = |r: usize, k: &str| reported(&out[r], "report", k);
    let ms = |us: u64| us * 1000;
    for r in 0..2 {
        let (grads, overlap) = (ms(get(r, "grads_us")), ms(get(r, "overlap_us")));
        let (reduced, step) = (ms(get(r, "reduced_us")), ms(get(r, "step_us")));
        // The overlap kernel ran right after the gradients, beside the all-reduce.
        let alone = (GRAD_MS + OVERLAP_MS) * MS;
        assert!(
            (alone..alone + 40 * MS).contains(&overlap) && grads >= GRAD_MS * MS,
            "rank {r}: gradients at {grads} ns, overlap kernel ended at {overlap} ns"
        );
        // The step waited for the all-reduce's end event (and for the overlap kernel).
        let ready = reduced.max(overlap);
        assert!(
            (ready + STEP_MS * MS..ready + (STEP_MS + 40) * MS).contains(&step),
            "rank {r}: all-reduce ended at {reduced} ns, the step at {step} ns"
        );
    }
    // Rank 0's all-reduce waited for rank 1, LATE_MS late: past its overlap kernel.
    let reduced0 = ms(get(0, "reduced_us"));
    assert!(
        reduced0 >= (LATE_MS + GRAD_MS - 80) * MS,
        "rank 0's all-reduce ended at {reduced0} ns"
    );
    assert!(
        ms(get(1, "reduced_us")) < (GRAD_MS + 60) * MS,
        "rank 1 found rank 0 waiting"
    );
    // GPU 0 was busy from the first kernel to the step, SM-active at 90% for the kernels and
    // at 15% for the all-reduce (its wait included).
    let (busy0, sm0, step0) = (get(0, "busy_ns"), get(0, "sm_ns"), ms(get(0, "step_us")));
    assert!(
        busy0.abs_diff(step0) < 60 * MS,
        "GPU 0 was busy {busy0} ns of {step0} ns"
    );
    let compute = share_of((GRAD_MS + OVERLAP_MS + STEP_MS) * MS, COMPUTE_SHARE);
    let comm = share_of(reduced0 - ms(get(0, "grads_us")), COMM_SHARE);
    assert!(
        sm0.abs_diff(compute + comm) < 30 * MS,
        "GPU 0 was SM-active {sm0} ns, expected {}",
        compute + comm
    );
}

/// The ranks of the group tests: three rounds of a fused send/receive pair, a broadcast and an
/// all-gather.
fn grouped_ranks(name: &str) -> bool {
    as_child(name, |c| {
        let api = Api::load(&c.lib_dir);
        let rank = Rank::open(&api, c.rank as i32, 1 << 20);
        let me = c.rank as i32;
        let comm = rank.comm(2, common::api::UniqueId(c.id), me);
        let (mut n, mut r) = (0, 0);
        // SAFETY: our communicator and valid out-pointers.
        unsafe {
            nccl_ok((api.ncclCommCount)(comm, &mut n), "ncclCommCount");
            nccl_ok((api.ncclCommUserRank)(comm, &mut r), "ncclCommUserRank");
        }
        assert_eq!((n, r), (2, me));
        let peer = 1 - me;
        let b = rank.buf as usize as *mut std::ffi::c_void;
        // Both ranks send first and receive second: without fusing the group this would wait
        // for each other forever.
        for _ in 0..3 {
            // SAFETY: device pointers into our 1 MiB buffer; counts fit it.
            unsafe {
                nccl_ok((api.ncclGroupStart)(), "ncclGroupStart");
                nccl_ok(
                    (api.ncclSend)(b, 1024, FLOAT32, peer, comm, rank.stream),
                    "ncclSend",
                );
                nccl_ok(
                    (api.ncclRecv)(b, 1024, FLOAT32, peer, comm, rank.stream),
                    "ncclRecv",
                );
                nccl_ok((api.ncclGroupEnd)(), "ncclGroupEnd");
                nccl_ok(
                    (api.ncclBroadcast)(b, b, 1024, FLOAT32, 0, comm, rank.stream),
                    "ncclBroadcast",
                );
                nccl_ok(
                    (api.ncclAllGather)(b, b, 1024, FLOAT32, comm, rank.stream),
                    "ncclAllGather",
                );
            }
        }
        rank.sync();
        println!("report done_ns={}", monotonic_ns());
        // SAFETY: our communicator.
        nccl_ok(unsafe { (api.ncclCommDestroy)(comm) }, "ncclCommDestroy");
    })
}

#[test]
fn grouped_sends_and_receives_pair_up() {
    let name = "grouped_sends_and_receives_pair_up";
    if grouped_ranks(name) {
        return;
    }
    let machine = Machine::new("p2p");
    let id = Api::load(&machine.lib_dir).unique_id();
    let env = [("STALLSCOPE_SIMGPU_DEVICES", "2")];
    let out = run_ranks(name, &machine, 2, &id.0, &env);
    assert!(reported(&out[0], "report", "done_ns") > 0);
}

#[test]
fn grouped_sends_and_receives_pair_up_with_idle_waits() {
    let name = "grouped_sends_and_receives_pair_up_with_idle_waits";
    if grouped_ranks(name) {
        return;
    }
    let machine = Machine::new("p2p-idle");
    let id = Api::load(&machine.lib_dir).unique_id();
    let env = [
        ("STALLSCOPE_SIMGPU_DEVICES", "2"),
        ("STALLSCOPE_SIMGPU_NCCL_WAIT", "idle"),
    ];
    let out = run_ranks(name, &machine, 2, &id.0, &env);
    assert!(reported(&out[0], "report", "done_ns") > 0);
}

/// Arguments and usage errors get NCCL's codes; a one-rank communicator needs no peer.
#[test]
fn errors_have_nccl_codes() {
    let name = "errors_have_nccl_codes";
    if as_child(name, |c| {
        let api = Api::load(&c.lib_dir);
        let mut version = 0;
        // SAFETY: valid out-pointers and arguments throughout; the bad ones are what is tested.
        unsafe {
            nccl_ok((api.ncclGetVersion)(&mut version), "ncclGetVersion");
            assert!(version >= 21_900, "{version}");
            let text = CStr::from_ptr((api.ncclGetErrorString)(4));
            assert!(text.to_str().unwrap().starts_with("invalid argument"));
            assert_eq!((api.ncclGroupEnd)(), 5, "ncclInvalidUsage without a group");
            let rank = Rank::open(&api, 0, 4096);
            let id = api.unique_id();
            let mut comm = std::ptr::null_mut();
            assert_eq!(
                (api.ncclCommInitRank)(&mut comm, 2, id, 2),
                4,
                "rank >= nranks"
            );
            assert_eq!((api.ncclCommInitRank)(&mut comm, 0, id, 0), 4, "no ranks");
            let mut bad = id;
            bad.0[0] ^= 0xff;
            assert_eq!(
                (api.ncclCommInitRank)(&mut comm, 1, bad, 0),
                4,
                "foreign id"
            );
            let comm = rank.comm(1, id, 0);
            let b = rank.buf as usize as *mut std::ffi::c_void;
            assert_eq!((api.ncclAllReduce)(b, b, 16, 99, SUM, comm, rank.stream), 4);
            assert_eq!(
                (api.ncclAllReduce)(b, b, 16, FLOAT32, 9, comm, rank.stream),
                4
            );
            assert_eq!(
                (api.ncclAllReduce)(b, b, 16, FLOAT32, SUM, std::ptr::null_mut(), rank.stream),
                4
            );
            assert_eq!(
                (api.ncclSend)(b, 16, FLOAT32, 1, comm, rank.stream),
                4,
                "peer 1 of 1"
            );
            rank.all_reduce(comm, 16);
            rank.sync();
            nccl_ok((api.ncclCommDestroy)(comm), "ncclCommDestroy");
            assert_eq!((api.ncclCommDestroy)(comm), 4, "destroyed twice");
        }
        println!("report ok=1");
    }) {
        return;
    }
    let machine = Machine::new("errors");
    let out = run_ranks(name, &machine, 1, &[0; 128], &[]);
    assert_eq!(reported(&out[0], "report", "ok"), 1);
}

/// Every entry point the profiler probes exists, each at its own address: a linker that folds
/// identical bodies into one symbol would make a probe on one fire for the other's calls.
#[test]
fn probed_symbols_exist_at_distinct_addresses() {
    const CUDA: &[&str] = &[
        "cuStreamSynchronize",
        "cuStreamSynchronize_ptsz",
        "cuEventSynchronize",
        "cuCtxSynchronize",
        "cuMemcpyHtoDAsync_v2",
        "cuMemcpyHtoDAsync_v2_ptsz",
        "cuMemcpyDtoHAsync_v2",
        "cuMemcpyDtoHAsync_v2_ptsz",
        "cuMemcpyAsync",
        "cuMemcpyAsync_ptsz",
        "cuMemcpyHtoD_v2",
        "cuMemcpyDtoH_v2",
        "cuMemcpy",
        "cuMemHostAlloc",
        "cuMemHostRegister_v2",
        "cuMemAllocHost_v2",
        "cuMemFreeHost",
        "cuMemHostUnregister",
        "cuLaunchKernel",
        "cuLaunchKernel_ptsz",
        "cuLaunchKernelEx",
        "cuLaunchKernelEx_ptsz",
        "cuLaunchHostFunc",
        "cuLaunchHostFunc_ptsz",
        "cuEventRecord",
        "cuEventRecord_ptsz",
        "cuStreamWaitEvent",
        "cuStreamWaitEvent_ptsz",
        "simgpuLaunchCommKernel",
    ];
    const NCCL: &[&str] = &[
        "ncclAllReduce",
        "ncclAllGather",
        "ncclReduceScatter",
        "ncclBroadcast",
        "ncclReduce",
        "ncclSend",
        "ncclRecv",
        "ncclGroupStart",
        "ncclGroupEnd",
        "ncclCommInitRank",
        "ncclCommDestroy",
        "ncclCommCount",
        "ncclCommUserRank",
        "ncclGetUniqueId",
        "ncclGetVersion",
        "ncclGetErrorString",
    ];
    let machine = Machine::new("symbols");
    let mut seen = std::collections::HashMap::new();
    for (file, names) in [("libcuda.so.1", CUDA), ("libnccl.so.2", NCCL)] {
        // SAFETY: our own library; nothing is called.
        let lib = unsafe { libloading::Library::new(machine.lib_dir.join(file)) }.unwrap();
        for name in names {
            // SAFETY: only the address is read: a `*const ()` symbol is the address itself.
            let sym = unsafe { lib.get::<*const ()>(name.as_bytes()) }
                .unwrap_or_else(|e| panic!("{file} lacks {name}: {e}"));
            let addr = *sym as usize;
            if let Some(other) = seen.insert(addr, *name) {
                panic!("{name} and {other} share the address {addr:#x}");
            }
        }
    }
}
