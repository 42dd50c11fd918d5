//! The CUDA and NCCL calls as the recording holds them: which library, and what each call
//! did, decoded from its arguments by `crate::cuda::APIS`. Part of the file format: a change
//! here is a change of the recording's layout (see `tests/format_versions.rs`).
use serde::{Deserialize, Serialize};

/// Which library a function lives in; a library file is probed for its kind's functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Library {
    /// libcuda.so: the driver, which every other layer (cudart, Triton, NCCL) ends in.
    Driver,
    /// libcudart.so: the runtime PyTorch links.
    Runtime,
    /// libnccl.so.
    Nccl,
}

impl Library {
    /// The library a mapped file is, by its file name.
    pub fn of_file(name: &str) -> Option<Self> {
        if name.starts_with("libcuda.so") {
            Some(Self::Driver)
        } else if name.starts_with("libcudart.so") {
            Some(Self::Runtime)
        } else if name.starts_with("libnccl.so") {
            Some(Self::Nccl)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Driver => "libcuda",
            Self::Runtime => "libcudart",
            Self::Nccl => "libnccl",
        }
    }
}

/// Copy direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CopyDir {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
    HostToHost,
    /// Unified addressing decides (cuMemcpyAsync, cudaMemcpyDefault).
    Unknown,
}

/// What a sync waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SyncScope {
    /// One stream: `handle` is the stream (0: the legacy default stream).
    Stream,
    /// An event, recorded on a stream the probes do not see.
    Event,
    /// Every stream of the context or device.
    Context,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Send,
    Recv,
}

impl Collective {
    pub fn name(self) -> &'static str {
        match self {
            Self::AllReduce => "all_reduce",
            Self::AllGather => "all_gather",
            Self::ReduceScatter => "reduce_scatter",
            Self::Broadcast => "broadcast",
            Self::Send => "send",
            Self::Recv => "recv",
        }
    }
}

/// A probed call, decoded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CudaOp {
    Sync {
        scope: SyncScope,
        handle: u64,
    },
    Copy {
        dir: CopyDir,
        dst: u64,
        src: u64,
        bytes: u64,
        stream: u64,
        /// Returns before the copy is done (pinned memory; pageable copies stage first).
        asynchronous: bool,
    },
    /// Page-locked host memory allocated or registered: `[addr, addr + bytes)`.
    Pin {
        addr: u64,
        bytes: u64,
    },
    /// Pinned memory freed or unregistered.
    Unpin {
        addr: u64,
    },
    /// An NCCL collective or point-to-point op: it only enqueues; the wait comes in a later
    /// sync on `stream`.
    Collective {
        op: Collective,
        bytes: u64,
        comm: u64,
        stream: u64,
        /// Peer (send/recv) or root (broadcast).
        peer: Option<u32>,
    },
    GroupEnd,
    /// `ncclCommInitRank`: `comm` is the new handle, `id` the unique id's first 8 bytes.
    CommInit {
        comm: u64,
        nranks: u32,
        rank: u32,
        id: u64,
    },
    /// Counted, not recorded per call.
    Launch,
    /// `cuEventRecord`: `event` now stands for everything queued on `stream` so far.
    EventRecord {
        event: u64,
        stream: u64,
    },
    /// `cuStreamWaitEvent`: work queued on `stream` from now on waits for `event`'s work
    /// (how DDP makes the compute stream wait for an all-reduce on the NCCL stream).
    StreamWaitEvent {
        stream: u64,
        event: u64,
    },
}
