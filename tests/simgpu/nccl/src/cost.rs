//! How long a collective's data movement takes once every rank has reached it: the bytes each
//! rank moves under NCCL's ring algorithms, over a fixed link rate, plus a launch latency.
//! Pure: no OS calls.

/// What a queued operation does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    Reduce,
    Send { peer: usize },
    Recv { peer: usize },
}

/// Env var: the simulated interconnect's rate in GB/s (bus bandwidth, as nccl-tests reports it).
pub const RATE_ENV: &str = "STALLSCOPE_SIMGPU_NCCL_GBPS";
/// An NVLink-class rate: what an all-reduce reaches between two H100s, roughly.
pub const DEFAULT_BYTES_PER_S: f64 = 100e9;
/// Fixed cost of every collective (kernel launch, protocol handshakes).
pub const LATENCY_NS: u64 = 10_000;

/// Bytes one rank sends for `kind`, given the call's buffer size in bytes (`count` × element
/// size, with `count` as that call defines it) on `nranks` ranks.
pub fn bytes_moved(kind: Kind, bytes: u64, nranks: usize) -> u64 {
    let n = nranks.max(1) as u64;
    match kind {
        // Reduce-scatter then all-gather around the ring: 2 (n-1)/n of the buffer.
        Kind::AllReduce => 2 * (n - 1) * bytes / n,
        // Each rank's `sendcount` (gather) or `recvcount` (scatter) part travels n-1 hops.
        Kind::AllGather | Kind::ReduceScatter => (n - 1) * bytes,
        Kind::Broadcast | Kind::Reduce if n == 1 => 0,
        Kind::Broadcast | Kind::Reduce | Kind::Send { .. } | Kind::Recv { .. } => bytes,
    }
}

/// Nanoseconds of device time to move `moved` bytes at `bytes_per_s`.
pub fn transfer_ns(moved: u64, bytes_per_s: f64) -> u64 {
    LATENCY_NS + (moved as f64 * 1e9 / bytes_per_s.max(1.0)).round() as u64
}

/// The link rate from `STALLSCOPE_SIMGPU_NCCL_GBPS`'s value, else the default.
pub fn rate_from_setting(value: Option<&str>) -> f64 {
    simgpu_state::host::gbps_setting(RATE_ENV, value, DEFAULT_BYTES_PER_S)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_volumes() {
        let mib = 1 << 20;
        assert_eq!(bytes_moved(Kind::AllReduce, 4 * mib, 2), 4 * mib);
        assert_eq!(bytes_moved(Kind::AllReduce, 4 * mib, 4), 6 * mib);
        assert_eq!(bytes_moved(Kind::AllReduce, 4 * mib, 1), 0);
        assert_eq!(bytes_moved(Kind::AllGather, mib, 4), 3 * mib);
        assert_eq!(bytes_moved(Kind::ReduceScatter, mib, 2), mib);
        assert_eq!(bytes_moved(Kind::Broadcast, mib, 1), 0);
        assert_eq!(bytes_moved(Kind::Send { peer: 1 }, mib, 2), mib);
    }

    #[test]
    fn time_is_latency_plus_bytes_over_rate() {
        assert_eq!(transfer_ns(0, 100e9), LATENCY_NS);
        assert_eq!(transfer_ns(100_000_000, 100e9), LATENCY_NS + 1_000_000);
        assert_eq!(rate_from_setting(Some("25")), 25e9);
        assert_eq!(rate_from_setting(Some("-1")), DEFAULT_BYTES_PER_S);
        assert_eq!(rate_from_setting(None), DEFAULT_BYTES_PER_S);
    }
}
