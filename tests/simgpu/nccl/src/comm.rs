//! Communicators: creation (which joins the rendezvous and waits for every rank, as
//! ncclCommInitRank blocks until all ranks are in), the handles C holds, and the per-rank
//! counters that number each operation the way every rank numbers it.
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::cost;
use crate::cuda::{Handle, cuda};
use crate::rendezvous::{MAX_RANKS, Rendezvous};
use crate::types::{
    NCCL_INVALID_ARGUMENT, NCCL_INVALID_USAGE, NCCL_SYSTEM_ERROR, NCCL_UNHANDLED_CUDA_ERROR,
    NcclResult, UNIQUE_ID_BYTES, ncclUniqueId,
};
use crate::wait::WaitMode;

/// First bytes of a unique id this library made.
const ID_MAGIC: &[u8; 8] = b"SIMNCCL1";
/// How long ncclCommInitRank waits for the other ranks to join.
const JOIN_TIMEOUT: Duration = Duration::from_secs(60);

/// How many operations of each kind this rank has queued: the k-th of a kind on one rank
/// matches the k-th on the others.
#[derive(Default)]
pub struct Counters {
    pub collectives: u64,
    pub sends: Vec<u64>,
    pub recvs: Vec<u64>,
}

pub struct Comm {
    pub rank: usize,
    pub nranks: usize,
    pub rdv: Arc<Rendezvous>,
    /// The stand-in kernel in the rank's context.
    pub kernel: usize,
    /// Link rate for transfer times, bytes per second.
    pub bytes_per_s: f64,
    /// How the rank's stream waits for the peers (`STALLSCOPE_SIMGPU_NCCL_WAIT`).
    pub wait: WaitMode,
    pub counters: Mutex<Counters>,
    /// Set when a peer died during an operation (ncclCommGetAsyncError reports it).
    pub failed: AtomicBool,
}

impl Comm {
    pub fn counters(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn kernel(&self) -> Handle {
        self.kernel as Handle
    }
}

static COMMS: Mutex<Option<HashMap<usize, Arc<Comm>>>> = Mutex::new(None);

fn comms() -> MutexGuard<'static, Option<HashMap<usize, Arc<Comm>>>> {
    COMMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The communicator behind handle `h`: NULL or unknown handles are invalid arguments.
pub fn lookup(h: usize) -> NcclResult<Arc<Comm>> {
    comms()
        .as_ref()
        .and_then(|m| m.get(&h).cloned())
        .ok_or(NCCL_INVALID_ARGUMENT)
}

/// Removes handle `h`. Work already queued keeps what it needs of the communicator.
pub fn destroy(h: usize) -> NcclResult<()> {
    comms()
        .as_mut()
        .and_then(|m| m.remove(&h))
        .map(drop)
        .ok_or(NCCL_INVALID_ARGUMENT)
}

/// A fresh unique id: magic, 8 random bytes, the creating pid.
pub fn new_unique_id() -> ncclUniqueId {
    let mut id = ncclUniqueId {
        internal: [0; UNIQUE_ID_BYTES],
    };
    id.internal[..8].copy_from_slice(ID_MAGIC);
    let mut random = [0u8; 8];
    // SAFETY: getrandom writes at most `random.len()` bytes into the buffer.
    let got = unsafe { libc::getrandom(random.as_mut_ptr().cast(), random.len(), 0) };
    if got != random.len() as isize {
        let t = simgpu_state::clock::realtime_ns() ^ u64::from(std::process::id()) << 40;
        random = t.to_le_bytes();
    }
    id.internal[8..16].copy_from_slice(&random);
    id.internal[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    id
}

/// The rendezvous file of `id`: in the simulated machine's directory (where its state file is),
/// so that a test's scratch directory holds both.
pub fn rendezvous_path(id: &ncclUniqueId, state: &Path) -> NcclResult<PathBuf> {
    if &id.internal[..8] != ID_MAGIC {
        eprintln!("simgpu: ncclCommInitRank: not a unique id from ncclGetUniqueId");
        return Err(NCCL_INVALID_ARGUMENT);
    }
    let mut key = [0u8; 8];
    key.copy_from_slice(&id.internal[8..16]);
    let dir = state
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    Ok(dir.join(format!("simgpu-nccl-{:016x}", u64::from_le_bytes(key))))
}

/// ncclCommInitRank: joins, waits for every rank, loads the kernel; returns the handle.
pub fn init_rank(nranks: i32, id: &ncclUniqueId, rank: i32) -> NcclResult<usize> {
    let n = usize::try_from(nranks).map_err(|_| NCCL_INVALID_ARGUMENT)?;
    let r = usize::try_from(rank).map_err(|_| NCCL_INVALID_ARGUMENT)?;
    if !(1..=MAX_RANKS).contains(&n) || r >= n {
        eprintln!("simgpu: ncclCommInitRank: rank {rank} of {nranks} (at most {MAX_RANKS} ranks)");
        return Err(NCCL_INVALID_ARGUMENT);
    }
    let path = rendezvous_path(id, &simgpu_state::state_path_from_env())?;
    let cuda = cuda().map_err(|e| {
        eprintln!("simgpu: ncclCommInitRank: {e}");
        NCCL_UNHANDLED_CUDA_ERROR
    })?;
    let kernel = cuda
        .current_ctx()
        .and_then(|_| cuda.load_kernel())
        .map_err(|e| {
            eprintln!("simgpu: ncclCommInitRank: {e}");
            NCCL_UNHANDLED_CUDA_ERROR
        })?;
    let wait = WaitMode::from_env();
    if matches!(wait, WaitMode::Busy { .. }) && cuda.launch_comm_kernel.is_none() {
        eprintln!(
            "simgpu: ncclCommInitRank: libcuda.so.1 has no simgpuLaunchCommKernel (not the \
             simulated driver?); set {}=idle",
            crate::wait::WAIT_ENV
        );
        return Err(NCCL_UNHANDLED_CUDA_ERROR);
    }
    let rdv = Rendezvous::open(&path, n).map_err(|e| {
        eprintln!("simgpu: ncclCommInitRank: {}: {e}", path.display());
        NCCL_SYSTEM_ERROR
    })?;
    rdv.join(r, std::process::id()).map_err(|e| {
        eprintln!("simgpu: ncclCommInitRank: {e}");
        NCCL_INVALID_USAGE
    })?;
    rdv.wait_all_joined(JOIN_TIMEOUT).map_err(|e| {
        eprintln!("simgpu: ncclCommInitRank: {e}");
        NCCL_SYSTEM_ERROR
    })?;
    let comm = Arc::new(Comm {
        rank: r,
        nranks: n,
        rdv: Arc::new(rdv),
        kernel: kernel as usize,
        bytes_per_s: cost::rate_from_setting(std::env::var(cost::RATE_ENV).ok().as_deref()),
        wait,
        counters: Mutex::new(Counters {
            collectives: 0,
            sends: vec![0; n],
            recvs: vec![0; n],
        }),
        failed: AtomicBool::new(false),
    });
    let h = Arc::as_ptr(&comm) as usize;
    comms().get_or_insert_with(HashMap::new).insert(h, comm);
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_fresh_and_name_a_file_next_to_the_state() {
        let (a, b) = (new_unique_id(), new_unique_id());
        assert_ne!(a.internal[8..16], b.internal[8..16]);
        let p = rendezvous_path(&a, Path::new("/dev/shm/state")).unwrap();
        assert!(p.starts_with("/dev/shm"));
        assert!(
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with("simgpu-nccl-")
        );
        let rel = rendezvous_path(&a, Path::new("state")).unwrap();
        assert!(rel.starts_with("."));
        let mut bad = a;
        bad.internal[0] = 0;
        assert_eq!(
            rendezvous_path(&bad, Path::new("/tmp/x")),
            Err(NCCL_INVALID_ARGUMENT)
        );
    }
}
