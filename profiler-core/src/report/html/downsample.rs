//! A lane cut down to a number of entries a browser draws at once.
//!
//! Entries shorter than the lane's span over `max` are joined with their short neighbours
//! until the joined entry is that long, and named by the key that took the most time in it.
//! Long entries stay as they are, so a long stall keeps its exact edges.

/// An interval in µs from the recording's start, with a key (a cause, a state, a call name)
/// and how much time it stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub start_us: i64,
    pub end_us: i64,
    pub key: u32,
    pub weight_ns: u64,
}

/// `entries` (in time order) cut down to about `max` over `span_us`.
pub fn downsample(entries: Vec<Entry>, span_us: i64, max: usize) -> Vec<Entry> {
    if entries.len() <= max {
        return entries;
    }
    let min = (span_us / max.max(1) as i64).max(1);
    let mut out: Vec<Entry> = Vec::with_capacity(max * 2);
    // The open group: its span, and each key's time in it.
    let mut group: Option<(Entry, Vec<(u32, u64)>)> = None;
    let close = |g: (Entry, Vec<(u32, u64)>), out: &mut Vec<Entry>| {
        let (mut e, weights) = g;
        if let Some(&(key, _)) = weights.iter().max_by_key(|(_, w)| *w) {
            e.key = key;
        }
        e.weight_ns = weights.iter().map(|(_, w)| w).sum();
        out.push(e);
    };
    for e in entries {
        if e.end_us - e.start_us >= min {
            if let Some(g) = group.take() {
                close(g, &mut out);
            }
            out.push(e);
            continue;
        }
        match &mut group {
            Some((g, weights)) if e.start_us - g.start_us < min => {
                g.end_us = g.end_us.max(e.end_us);
                match weights.iter_mut().find(|(k, _)| *k == e.key) {
                    Some((_, w)) => *w += e.weight_ns,
                    None => weights.push((e.key, e.weight_ns)),
                }
            }
            _ => {
                if let Some(g) = group.take() {
                    close(g, &mut out);
                }
                group = Some((e, vec![(e.key, e.weight_ns)]));
            }
        }
    }
    if let Some(g) = group.take() {
        close(g, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(start_us: i64, end_us: i64, key: u32) -> Entry {
        Entry {
            start_us,
            end_us,
            key,
            weight_ns: (end_us - start_us) as u64 * 1000,
        }
    }

    #[test]
    fn short_neighbours_join_under_the_key_with_the_most_time_and_long_ones_stay() {
        let mut list = Vec::new();
        for i in 0..1000 {
            list.push(e(
                i * 10,
                i * 10 + if i % 4 == 0 { 7 } else { 3 },
                (i % 4 == 0) as u32,
            ));
        }
        list.push(e(10_000, 20_000, 5));
        let out = downsample(list, 20_000, 100);
        assert!(out.len() <= 120, "{}", out.len());
        assert_eq!(*out.last().unwrap(), e(10_000, 20_000, 5));
        assert!(out.windows(2).all(|w| w[0].end_us <= w[1].start_us));
        // Key 1 holds 7 µs of every 40, key 0 holds 9: key 0 wins each joined entry.
        assert!(out[..out.len() - 1].iter().all(|x| x.key == 0));
        let total: u64 = out.iter().map(|x| x.weight_ns).sum();
        assert_eq!(total, (250 * 7 + 750 * 3 + 10_000) * 1000);
    }

    #[test]
    fn a_short_lane_is_left_alone() {
        let list = vec![e(0, 1, 0), e(1, 2, 1)];
        assert_eq!(downsample(list.clone(), 10, 100), list);
    }
}
