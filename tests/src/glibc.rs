//! Which glibc a binary needs, from `objdump -T`'s versioned symbols: the newest `GLIBC_x.y`
//! any of them names is the oldest glibc the binary starts on.

/// The newest glibc version named in `objdump -T` output, as (major, minor, patch).
pub fn newest_needed(objdump_t: &str) -> Option<(u32, u32, u32)> {
    objdump_t
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((
                parts.next()??,
                parts.next()??,
                parts.next().flatten().unwrap_or(0),
            ))
        })
        .max()
}

/// Every symbol that needs a glibc newer than `max`, with the version it needs.
pub fn newer_than(objdump_t: &str, max: (u32, u32, u32)) -> Vec<String> {
    objdump_t
        .lines()
        .filter(|l| newest_needed(l).is_some_and(|v| v > max))
        .map(|l| {
            l.split_whitespace()
                .rev()
                .take(2)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const OBJDUMP: &str = "\
0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.2.5) memcpy
0000000000000000      DF *UND*\t0000000000000000 (GLIBC_2.17) clock_gettime
0000000000000000  w   DF *UND*\t0000000000000000 (GLIBC_PRIVATE) __libc_x
0000000000000000      DF *UND*\t0000000000000000  GLIBC_2.3.4 __sprintf_chk
";

    #[test]
    fn the_newest_version_wins_and_private_is_ignored() {
        assert_eq!(newest_needed(OBJDUMP), Some((2, 17, 0)));
        assert!(newer_than(OBJDUMP, (2, 17, 0)).is_empty());
        let newer =
            format!("{OBJDUMP}0000000000000000      DF *UND*\t0 (GLIBC_2.34) __libc_start_main\n");
        assert_eq!(newest_needed(&newer), Some((2, 34, 0)));
        assert_eq!(
            newer_than(&newer, (2, 17, 0)),
            ["__libc_start_main (GLIBC_2.34)"]
        );
        assert_eq!(newest_needed("no versions"), None);
    }
}
