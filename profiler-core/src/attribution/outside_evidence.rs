//! What a feeder that waits for work from outside the job waited on, and the work it got: the
//! socket (or pipe) in its `blocked_on`, the requests that ended its waits, and how long each
//! took to serve. The field guides' advice for a server with sparse requests is to watch
//! these, not the GPU's utilization.
//!
//! A request is a sampled wait for outside input that ended: the recorder samples one off-CPU
//! interval of a thread per sampling interval (5 ms by default) on average, up to four in a
//! row, so while requests take longer than that to serve, every wait between two of them is
//! sampled (even one that follows a short wait inside the request) and the count is exact;
//! past it, a lower bound.
use serde::{Deserialize, Serialize};

use super::roles::Roles;
use crate::analysis::{
    model::Analysis,
    percentiles::Percentiles,
    wait_for::{WaitFor, call_wait},
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OutsideEvidence {
    /// What the feeder waited on, the most time first: `recvfrom on socket TCP
    /// 127.0.0.1:5000 <- 127.0.0.1:40412`.
    pub waited_on: Vec<String>,
    /// Requests served over the GPU's observed time, and per second.
    pub requests: u64,
    pub requests_per_sec: f64,
    /// From the end of a wait for input to the start of the next: serving one request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_p50_ns: Option<u64>,
    /// The GPU's busy time per request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_ns_per_request: Option<u64>,
}

impl OutsideEvidence {
    /// `5.1 requests/s arrived on socket TCP ... (recvfrom); each was served in p50 31 ms,
    /// 24 ms of it on the GPU`.
    pub fn describe(&self) -> String {
        let ms = |ns: u64| ns as f64 / 1e6;
        let mut s = format!("{:.1} requests/s", self.requests_per_sec);
        if let Some(on) = self.waited_on.first() {
            s.push_str(&format!(" arrived on {on}"));
        }
        if let Some(p50) = self.service_p50_ns {
            s.push_str(&format!("; each was served in p50 {:.1} ms", ms(p50)));
            if let Some(gpu) = self.gpu_ns_per_request {
                s.push_str(&format!(", {:.1} ms of it on the GPU", ms(gpu)));
            }
        }
        s
    }
}

const TOP_WAITS: usize = 3;

/// The feeders' outside waits over `covered` (`[from, to]`), with the GPU busy `busy_ns`
/// meanwhile; `None` when no feeder waited on anything from outside.
pub fn gather(
    a: &Analysis,
    roles: &Roles,
    covered: Option<(u64, u64)>,
    busy_ns: u64,
) -> Option<OutsideEvidence> {
    let traced = |pid: u32| a.processes.contains_key(&pid);
    let mut waits: Vec<(String, u64)> = roles
        .feeders
        .iter()
        .filter_map(|t| a.threads.get(t))
        .flat_map(|t| &t.blocked_on)
        .filter(|b| call_wait(b.kind, &b.detail, traced) == WaitFor::Outside)
        .map(|b| (format!("{} ({})", b.detail, b.call), b.ns))
        .collect();
    waits.sort_by(|x, y| y.1.cmp(&x.1).then_with(|| x.0.cmp(&y.0)));
    let (from, to) = covered?;
    let mut requests = 0u64;
    let mut service = Percentiles::new();
    for &tid in &roles.feeders {
        let mut served_from: Option<u64> = None;
        for (start, len, wait) in a.callers_off_cpu.spans_of(tid, from, to) {
            if wait != WaitFor::Outside {
                continue;
            }
            if let Some(from) = served_from {
                service.record(start.saturating_sub(from));
            }
            let end = start.saturating_add(len);
            if end <= to {
                requests += 1;
                served_from = Some(end);
            }
        }
    }
    if requests == 0 && waits.is_empty() {
        return None;
    }
    let secs = to.saturating_sub(from) as f64 / 1e9;
    Some(OutsideEvidence {
        waited_on: waits.into_iter().take(TOP_WAITS).map(|(w, _)| w).collect(),
        requests,
        requests_per_sec: if secs > 0.0 {
            requests as f64 / secs
        } else {
            0.0
        },
        service_p50_ns: service.percentile(50),
        gpu_ns_per_request: (requests > 0).then(|| busy_ns / requests),
    })
}
