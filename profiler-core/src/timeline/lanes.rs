//! Intervals packed into lanes in which none overlaps another, as trace viewers need.
use super::slice::Slice;

/// Sorts `slices` by start (longer first on a tie) and puts each in the first lane whose last
/// slice has ended by then: the fewest lanes a greedy pass finds, every lane in time order.
pub fn pack(mut slices: Vec<Slice>) -> Vec<Vec<Slice>> {
    slices.sort_by(|x, y| x.start_ns.cmp(&y.start_ns).then(y.end_ns.cmp(&x.end_ns)));
    let mut lanes: Vec<Vec<Slice>> = Vec::new();
    for s in slices {
        match lanes
            .iter_mut()
            .find(|l| l.last().is_none_or(|last| last.end_ns <= s.start_ns))
        {
            Some(lane) => lane.push(s),
            None => lanes.push(vec![s]),
        }
    }
    lanes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_slices_go_to_new_lanes_and_each_lane_is_disjoint() {
        let s = |a, b| Slice::new(a, b, "x");
        let lanes = pack(vec![s(0, 10), s(5, 8), s(10, 20), s(6, 30), s(25, 26)]);
        assert_eq!(lanes.len(), 3);
        for lane in &lanes {
            assert!(lane.windows(2).all(|w| w[0].end_ns <= w[1].start_ns));
        }
        let n: usize = lanes.iter().map(Vec::len).sum();
        assert_eq!(n, 5);
        assert_eq!(
            lanes[0].iter().map(|s| s.start_ns).collect::<Vec<_>>(),
            [0, 10, 25]
        );
    }
}
