//! Hand-built pieces of recordings for the attribution's unit tests.
use crate::cuda::{Collective, CollectiveSpan};

/// An all-reduce of PID `pid` (its own thread) on communicator 1, named 9 across ranks.
pub fn all_reduce(pid: u32, seq: u64, enqueue_ns: u64, done_ns: Option<u64>) -> CollectiveSpan {
    CollectiveSpan {
        pid,
        tid: pid,
        op: Collective::AllReduce,
        bytes: 4,
        comm: 1,
        comm_id: Some(9),
        seq,
        enqueue_ns,
        done_ns,
    }
}
