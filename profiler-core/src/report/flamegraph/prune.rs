//! Cuts folded lines down to what a flame graph draws, before inferno merges them.
//!
//! inferno merges every line into frames, then drops the frames narrower than `min_width`
//! percent of the total. An hour's recording has a hundred thousand distinct stacks whose deep
//! frames are mostly far narrower than that, and merging them was most of a report's time and
//! memory. A frame's width is the sum of the counts of the lines beneath it, which one pass
//! over the sorted lines gives. Each line is then cut one frame below its deepest drawn frame:
//! that last frame is too narrow to draw, so it stands in for everything beneath it. The SVG
//! comes out the same, except where one frame's name is a prefix of a sibling's (`f1`,
//! `f10`): lines sort differently once cut, so such undrawn siblings can trade places, and a
//! frame inferno would have split in two around its sibling can come out whole.

/// The lines to draw instead of `lines`, or `None` when they are already as small as can be or
/// are not in the plain `stack count` form this understands (inferno then gets them as they
/// are).
pub(crate) fn drawable(lines: &[String], min_width_pct: f64) -> Option<Vec<String>> {
    let mut stacks: Vec<&str> = Vec::with_capacity(lines.len());
    let mut counts: Vec<u64> = Vec::with_capacity(lines.len());
    for line in lines {
        let (stack, count) = parse(line)?;
        stacks.push(stack);
        counts.push(count);
    }
    if !lines.windows(2).all(|w| w[0] <= w[1]) {
        return None;
    }
    let mut prefix = Vec::with_capacity(counts.len() + 1);
    prefix.push(0u64);
    for &c in &counts {
        prefix.push(prefix.last()?.checked_add(c)?);
    }
    let time = *prefix.last()?;
    if time == 0 {
        return None;
    }
    // inferno's own arithmetic, so that both agree on every frame.
    let widthpertime_pct = 100.0 / time as f64;
    let minwidth_time = min_width_pct / widthpertime_pct;
    let drawn = |total: u64| (total as f64) >= minwidth_time;

    // keep[i]: frames of line i that are drawn. Nodes close deepest first, so the first drawn
    // node to close over a line is its deepest drawn one.
    let mut keep = vec![0usize; stacks.len()];
    let mut open: Vec<usize> = Vec::new();
    let close = |open: &mut Vec<usize>, depth: usize, end: usize, keep: &mut [usize]| {
        while open.len() > depth {
            let start = open.pop().unwrap_or(end);
            if drawn(prefix[end] - prefix[start]) {
                let frames = open.len() + 1;
                for k in &mut keep[start..end] {
                    if *k == 0 {
                        *k = frames;
                    }
                }
            }
        }
    };
    let mut prev = "";
    for (i, stack) in stacks.iter().enumerate() {
        let common = if i == 0 {
            0
        } else {
            shared_frames(prev, stack)
        };
        let frames = semicolons(stack.as_bytes()) + 1;
        close(&mut open, common, i, &mut keep);
        open.extend(std::iter::repeat_n(i, frames - common));
        prev = stack;
    }
    close(&mut open, 0, stacks.len(), &mut keep);

    let mut out: Vec<(&str, u64)> = Vec::new();
    for ((stack, count), keep) in stacks.iter().zip(&counts).zip(&keep) {
        let cut = cut_after(stack, keep + 1);
        match out.last_mut() {
            Some((last, total)) if *last == cut => *total += count,
            _ => out.push((cut, *count)),
        }
    }
    if out.len() == lines.len() {
        return None;
    }
    // A cut line ends in ` count` where the whole one went on with `;`: the space sorts before
    // the characters of a name, the `;` after them. Sort again, as inferno would, merging the
    // cut lines that meet.
    out.sort_unstable_by(|x, y| x.0.cmp(y.0));
    out.dedup_by(|later, kept| {
        if later.0 != kept.0 {
            return false;
        }
        kept.1 += later.1;
        true
    });
    let mut out: Vec<String> = out.iter().map(|(s, c)| format!("{s} {c}")).collect();
    out.sort_unstable();
    Some(out)
}

/// `stack count`, read as inferno reads it; `None` for anything it might read otherwise
/// (surrounding blanks, comments, fractions, a second count column).
fn parse(line: &str) -> Option<(&str, u64)> {
    if line.trim() != line || line.starts_with("# ") {
        return None;
    }
    let (stack, count) = line.rsplit_once(' ')?;
    if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let count = count.parse().ok()?;
    if stack.is_empty() || stack.trim_end() != stack {
        return None;
    }
    let looks_like_count =
        |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if stack
        .rsplit_once(' ')
        .is_some_and(|(_, last)| looks_like_count(last))
    {
        return None;
    }
    Some((stack, count))
}

/// How many leading frames two stacks share.
pub(super) fn shared_frames(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let same = common_prefix(a, b);
    let edge = |s: &[u8]| s.len() == same || s[same] == b';';
    semicolons(&a[..same]) + usize::from(edge(a) && edge(b))
}

fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let mut n = 0;
    for (x, y) in a.chunks_exact(8).zip(b.chunks_exact(8)) {
        let x = u64::from_le_bytes(x.try_into().unwrap_or_default());
        let y = u64::from_le_bytes(y.try_into().unwrap_or_default());
        if x != y {
            return n + ((x ^ y).trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + a[n..]
        .iter()
        .zip(&b[n..])
        .take_while(|(x, y)| x == y)
        .count()
}

fn semicolons(s: &[u8]) -> usize {
    s.iter().filter(|&&c| c == b';').count()
}

/// The first `frames` frames of `stack`.
fn cut_after(stack: &str, frames: usize) -> &str {
    match stack.match_indices(';').nth(frames.saturating_sub(1)) {
        Some((at, _)) if frames > 0 => &stack[..at],
        _ => stack,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cuts_one_frame_below_the_deepest_drawn_one() {
        // Total 1000; at 1% a frame needs 10 to be drawn.
        let input = lines(&[
            "a;b;c;d 400",
            "a;b;e;f 3",
            "a;b;e;g 4",
            "a;h;i 2",
            "a;h;j 1",
            "k 590",
        ]);
        let got = drawable(&input, 1.0).unwrap();
        assert_eq!(got, ["a;b;c;d 400", "a;b;e 7", "a;h 3", "k 590"]);
    }

    #[test]
    fn leaves_small_or_foreign_input_alone() {
        assert_eq!(drawable(&lines(&["a;b 5", "a;c 5"]), 0.01), None);
        assert_eq!(drawable(&lines(&["b 5", "a 5"]), 50.0), None, "unsorted");
        assert_eq!(drawable(&lines(&["a;b 1.5", "a;c 1"]), 90.0), None);
        assert_eq!(drawable(&lines(&["a;b 10 5", "a;c 1"]), 90.0), None);
        assert_eq!(drawable(&lines(&[" a;b 1", "a;c 1"]), 90.0), None);
        assert_eq!(drawable(&lines(&["a;b 0", "a;c 0"]), 90.0), None);
        assert_eq!(drawable(&[], 0.01), None);
    }

    #[test]
    fn shared_frames_stop_at_the_first_difference() {
        assert_eq!(shared_frames("a;b;c", "a;b;c"), 3);
        assert_eq!(shared_frames("a;b;c", "a;b;d"), 2);
        assert_eq!(shared_frames("a;b", "a;b;c"), 2);
        assert_eq!(shared_frames("a;bc", "a;b;c"), 1);
        assert_eq!(shared_frames("x;a", "y;a"), 0);
        let long = "frame_number_one;frame_number_two;frame_number_three";
        assert_eq!(shared_frames(long, &long.replace("three", "thre")), 2);
        assert_eq!(shared_frames(long, &long.replace("two", "twx")), 1);
        assert_eq!(common_prefix(b"0123456789abcdef", b"0123456789abcdeX"), 15);
    }

    #[test]
    fn cut_after_counts_frames() {
        assert_eq!(cut_after("a;b;c", 1), "a");
        assert_eq!(cut_after("a;b;c", 2), "a;b");
        assert_eq!(cut_after("a;b;c", 3), "a;b;c");
        assert_eq!(cut_after("a;b;c", 9), "a;b;c");
    }
}
