//! The whole host's CPU time by mode, all CPUs together, since boot: the first line of
//! /proc/stat (read alone: the recorder reads it at every tick, and the rest of the file, the
//! per-CPU lines and every interrupt's count, is not wanted).
use std::io::BufRead as _;

/// /proc/stat's modes, in its order.
pub const MODES: [&str; 8] = [
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal",
];

/// The modes the CPUs were busy in: all but `idle` and `iowait`.
const BUSY: [bool; 8] = [true, true, true, false, false, true, true, true];

/// Seconds in each of [`MODES`]; `None` when /proc/stat cannot be read.
pub fn seconds() -> Option<[f64; 8]> {
    let mut line = String::new();
    std::io::BufReader::new(std::fs::File::open("/proc/stat").ok()?)
        .read_line(&mut line)
        .ok()?;
    let rest = line.strip_prefix("cpu ")?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let mut out = [0.0; 8];
    for (slot, v) in out.iter_mut().zip(rest.split_whitespace()) {
        *slot = v.parse::<f64>().ok()? / hz;
    }
    Some(out)
}

/// Busy and all CPU time, ns.
pub fn busy_and_total_ns() -> Option<(u64, u64)> {
    let s = seconds()?;
    let busy: f64 = s.iter().zip(BUSY).filter(|(_, b)| *b).map(|(v, _)| v).sum();
    let total: f64 = s.iter().sum();
    Some(((busy * 1e9) as u64, (total * 1e9) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_busy_time_is_part_of_all_of_it() {
        let (busy, total) = busy_and_total_ns().expect("/proc/stat reads");
        assert!(busy > 0 && busy <= total, "busy {busy} of {total} ns");
    }
}
