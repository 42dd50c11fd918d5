//! What a window's cause scores are computed from: the rules fill it in, each cause's spec
//! scores it.
use super::window::States;

/// What a window's scores are computed from (see the module's formulas), all as fractions of
/// the feeder's accounted time.
#[derive(Clone, Copy, Debug, Default)]
pub struct Shares {
    pub feeder: States,
    /// The workers' on-CPU, queued and IO-wait shares of their active time.
    pub workers_on: f64,
    pub workers_rq: f64,
    pub workers_io: f64,
    /// The feeder's run-queue time not taken as a spinning sync's.
    pub runqueue_left: f64,
    /// The feeder's on-CPU time beyond its CUDA calls and the spin that covers the busy part.
    pub own_work: f64,
    /// Copy and collective waits beyond the busy part (probes).
    pub copy: f64,
    pub collective: f64,
    pub link_limited: bool,
    pub launch_bound: bool,
    /// The feeder's blocked time waiting for the GIL, on a lock of the job, and for work from
    /// outside the job; `blocked_left` is the rest, which the workers' causes explain.
    pub gil: f64,
    pub lock: f64,
    pub no_work: f64,
    pub blocked_left: f64,
}
