//! Two ranks in two processes, each on its own simulated GPU, through the simulated
//! libnccl.so.2: a collective only queues work, a rank's stream waits (GPU idle) until the
//! slowest rank gets there, and grouped sends and receives pair up.
//!
//! Needs the built libraries: `cargo build --release -p simgpu-cuda -p simgpu-nvml
//! -p simgpu-nccl` first.
mod common;

use std::ffi::CStr;
use std::time::Instant;

use common::api::{Api, FLOAT32, Rank, SUM, nccl_ok};
use common::{MS, Machine, as_child, reported, run_ranks, straggle};
use simgpu_state::clock::monotonic_ns;

/// How long rank 1 dawdles before its all-reduce.
const STRAGGLE_MS: u64 = 600;
/// Each rank's compute before the all-reduce.
const KERNEL_MS: u64 = 200;
/// Floats all-reduced: 16 MiB.
const COUNT: usize = 4 << 20;

#[test]
fn all_reduce_waits_for_the_slowest_rank() {
    let name = "all_reduce_waits_for_the_slowest_rank";
    if as_child(name, |c| {
        let api = Api::load(&c.lib_dir);
        let rank = Rank::open(&api, c.rank as i32, COUNT * 4);
        let comm = rank.comm(2, common::api::UniqueId(c.id), c.rank as i32);
        let gpu_busy = || {
            let state = simgpu_state::SharedState::open(&c.state, Default::default()).unwrap();
            state.device(c.rank as u32).unwrap().busy_total_ns()
        };
        let busy_before = gpu_busy();
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
        let busy_ns = gpu_busy() - busy_before;
        println!(
            "report enqueue_ns={enqueue_ns} sync_ns={sync_ns} done_ns={done_ns} busy_ns={busy_ns}"
        );
        // SAFETY: our communicator.
        nccl_ok(unsafe { (api.ncclCommDestroy)(comm) }, "ncclCommDestroy");
    }) {
        return;
    }
    let machine = Machine::new("straggler");
    let id = Api::load(&machine.lib_dir).unique_id();
    let out = run_ranks(
        name,
        &machine,
        2,
        &id.0,
        &[("STALLSCOPE_SIMGPU_DEVICES", "2")],
    );
    let get = |r: usize, k: &str| reported(&out[r], "report", k);
    for (r, o) in out.iter().enumerate() {
        let text = String::from_utf8_lossy(&o.stdout);
        let line = text
            .lines()
            .find(|l| l.contains("report"))
            .unwrap_or_default();
        eprintln!("rank {r}: {line}");
    }
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
    // While it waited, rank 0's GPU was idle: busy only for its kernel and the transfer.
    let busy0 = get(0, "busy_ns");
    assert!(
        (KERNEL_MS * MS..(KERNEL_MS + 60) * MS).contains(&busy0),
        "GPU 0 was busy {busy0} ns of a {waited} ns wait"
    );
    assert!(!machine.root.read_dir().unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("simgpu-nccl-")
    }));
}

#[test]
fn grouped_sends_and_receives_pair_up() {
    let name = "grouped_sends_and_receives_pair_up";
    if as_child(name, |c| {
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
    }) {
        return;
    }
    let machine = Machine::new("p2p");
    let id = Api::load(&machine.lib_dir).unique_id();
    let out = run_ranks(
        name,
        &machine,
        2,
        &id.0,
        &[("STALLSCOPE_SIMGPU_DEVICES", "2")],
    );
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
