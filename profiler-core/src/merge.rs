//! Reporting several recordings of one job (one per host) together.
use crate::model::Analysis;

/// What a combined report can and cannot compare across hosts, with the wall-clock spread of
/// the recordings' starts.
pub fn clock_note(recordings: &[&Analysis]) -> String {
    let starts: Vec<u64> = recordings
        .iter()
        .filter_map(|a| a.meta.as_ref().map(|m| m.start_unix_ns))
        .filter(|&t| t > 0)
        .collect();
    let spread = match (starts.iter().min(), starts.iter().max()) {
        (Some(lo), Some(hi)) => format!(
            "; their starts differ by {:.3} s of wall-clock time",
            (hi - lo) as f64 / 1e9
        ),
        _ => String::new(),
    };
    format!(
        "clock caveat: each host's timestamps are its own CLOCK_MONOTONIC, which other hosts \
         cannot compare; ranks are compared by their total wait in collectives, never by \
         timestamps, and wall-clock times are only as close as the hosts' clock sync (NTP: \
         milliseconds){spread}"
    )
}
