//! CPython line number tables: turning the instruction a sampled Python frame was executing
//! (its byte offset into the code object's bytecode) into the source line a flame graph
//! shows, the way `PyCode_Addr2Line` does inside the interpreter. The profiler cannot call
//! the interpreter, so it reads the code object's table out of the target's memory and
//! decodes it here.
//!
//! CPython has used three formats since 3.8:
//!
//! * 3.8 and 3.9, `co_lnotab`: pairs of (unsigned byte offset increment, signed line
//!   increment). The line at an offset is `co_firstlineno` plus the line increments of every
//!   pair whose cumulative offset is at or before it. Every offset has a line; offsets past
//!   the end get the last one (as `PyCode_Addr2Line` does).
//! * 3.10, `co_linetable` (PEP 626): pairs of (unsigned byte length of a range, signed line
//!   delta), the delta applying to the range it starts; a delta of -128 marks a range with no
//!   line and leaves the running line alone. Zero-length ranges only carry line deltas.
//! * 3.11 and later, `co_linetable` as the location table (CPython's `Objects/locations.md`):
//!   entries whose first byte has the top bit set, bits 3-6 a kind and bits 0-2 the length
//!   in code units minus one. Kinds 0-9 (short form) and 10-12 (one-line form, line delta
//!   kind - 10) carry column bytes; 13 (no columns) and 14 (long form) start with a signed
//!   varint line delta, 14 followed by three more varints; 15 means no location. Varints are
//!   6-bit chunks, least significant first, bit 6 meaning "more"; the signed varint keeps the
//!   sign in its lowest bit. Lines are relative to the previous entry's line, starting at
//!   `co_firstlineno`.
//!
//! The tables come from another process's memory and may be garbage: nothing here indexes
//! without checking, the arithmetic cannot overflow, and every loop consumes a byte per turn.

/// The line of the instruction at `byte_offset` (in bytes from the start of the code, i.e. an
/// index into co_code for 3.8-3.10, or 2 * the code-unit index for 3.11+), given the code
/// object's co_firstlineno and its table: co_lnotab for 3.8 and 3.9, co_linetable for 3.10
/// (the PEP 626 format of 3.10), co_linetable for 3.11+ (the location table of 3.11+, see
/// Objects/locations.md in CPython). `minor` is the 3.x minor version. None when the offset
/// has no line (or the table is malformed).
///
/// Only minors 8 to 13 are accepted (the ones tested against real interpreters); any other
/// gives None.
pub fn line_for(minor: u8, table: &[u8], firstlineno: i32, byte_offset: u32) -> Option<u32> {
    let line = match minor {
        8 | 9 => lnotab_line(table, firstlineno, byte_offset),
        10 => pep626_line(table, firstlineno, byte_offset)?,
        11..=13 => location_line(table, firstlineno, byte_offset)?,
        _ => return None,
    };
    u32::try_from(line).ok()
}

/// 3.8/3.9 `PyCode_Addr2Line`: walk the pairs, stopping at the first whose cumulative offset
/// passes the one asked for. A trailing odd byte is ignored, as CPython's `size / 2` does.
fn lnotab_line(table: &[u8], firstlineno: i32, byte_offset: u32) -> i64 {
    let target = u64::from(byte_offset);
    let mut line = i64::from(firstlineno);
    let mut addr: u64 = 0;
    for pair in table.chunks_exact(2) {
        addr += u64::from(pair[0]);
        if addr > target {
            break;
        }
        line += i64::from(pair[1] as i8);
    }
    line
}

/// 3.10 `_PyCode_CheckLineNumber` over `PyLineTable_NextAddressRange`: ranges are advanced
/// until one ends after the offset; its line (None for a -128 delta) is the answer.
fn pep626_line(table: &[u8], firstlineno: i32, byte_offset: u32) -> Option<i64> {
    let target = u64::from(byte_offset);
    let mut computed_line = i64::from(firstlineno);
    let mut ar_line: Option<i64> = None;
    let mut ar_start: u64;
    let mut ar_end: u64 = 0;
    let mut pairs = table.chunks_exact(2);
    // One step of CPython's `advance`.
    let mut advance = |pair: &[u8], ar_end: &mut u64| -> u64 {
        let start = *ar_end;
        *ar_end += u64::from(pair[0]);
        let ldelta = pair[1] as i8;
        if ldelta == -128 {
            ar_line = None;
        } else {
            computed_line += i64::from(ldelta);
            ar_line = Some(computed_line);
        }
        start
    };
    while ar_end <= target {
        // PyLineTable_NextAddressRange: one step, then skip empty ranges.
        let pair = pairs.next()?;
        ar_start = advance(pair, &mut ar_end);
        while ar_start == ar_end {
            // CPython asserts there is more; a malformed table just ends here.
            let pair = pairs.next()?;
            ar_start = advance(pair, &mut ar_end);
        }
    }
    ar_line
}

/// 3.11+ `_PyCode_CheckLineNumber` over the location table.
fn location_line(table: &[u8], firstlineno: i32, byte_offset: u32) -> Option<i64> {
    let target = u64::from(byte_offset);
    let mut computed_line = i64::from(firstlineno);
    let mut ar_line: Option<i64> = None;
    let mut ar_end: u64 = 0;
    let mut pos = 0usize;
    while ar_end <= target {
        // PyLineTable_NextAddressRange: at the end, no more ranges.
        let first = *table.get(pos)?;
        let kind = (first >> 3) & 15;
        let delta: i64 = match kind {
            13 | 14 => i64::from(signed_varint(table, pos + 1)?),
            10..=12 => i64::from(kind - 10),
            // Short forms (0-9) stay on the line; 15 has none.
            _ => 0,
        };
        computed_line = computed_line.saturating_add(delta);
        // CPython's is_no_line_marker: the whole top five bits set.
        ar_line = if first >> 3 == 0x1f {
            None
        } else {
            Some(computed_line)
        };
        ar_end += (u64::from(first & 7) + 1) * 2;
        // The next entry starts at the next byte with the top bit set.
        pos += 1;
        while table.get(pos).is_some_and(|b| b & 128 == 0) {
            pos += 1;
        }
    }
    ar_line
}

/// CPython's `scan_varint`: 6-bit chunks, least significant first, bit 6 set while more
/// follow. None if the table ends inside it; bits beyond 32 are dropped (CPython's
/// `unsigned int` would lose them too).
fn varint(table: &[u8], mut pos: usize) -> Option<u32> {
    let mut read = *table.get(pos)?;
    let mut val = u32::from(read & 63);
    let mut shift = 0u32;
    while read & 64 != 0 {
        pos += 1;
        read = *table.get(pos)?;
        shift = shift.saturating_add(6);
        if shift < 32 {
            val |= u32::from(read & 63) << shift;
        }
    }
    Some(val)
}

/// CPython's `scan_signed_varint`: the sign in the lowest bit of the unsigned varint.
fn signed_varint(table: &[u8], pos: usize) -> Option<i32> {
    let uval = varint(table, pos)?;
    // uval >> 1 fits in an i32 either way.
    let magnitude = (uval >> 1) as i32;
    Some(if uval & 1 != 0 { -magnitude } else { magnitude })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(minor: u8, text: &str) -> usize {
        let doc: serde_json::Value = serde_json::from_str(text).expect("fixture parses");
        assert_eq!(doc["minor"].as_u64(), Some(u64::from(minor)));
        let mut checks = 0;
        let codes = doc["code"].as_array().expect("code array");
        assert!(!codes.is_empty());
        for code in codes {
            let name = code["name"].as_str().expect("name");
            let firstlineno = code["firstlineno"].as_i64().expect("firstlineno") as i32;
            let table = hex(code["table"].as_str().expect("table"));
            let lines = code["lines"].as_array().expect("lines");
            for (unit, expected) in lines.iter().enumerate() {
                let offset = 2 * unit as u32;
                let expected = expected.as_u64().map(|l| l as u32);
                let got = line_for(minor, &table, firstlineno, offset);
                assert_eq!(got, expected, "3.{minor} {name} at byte offset {offset}");
                checks += 1;
            }
        }
        eprintln!("3.{minor}: {checks} (code object, offset) checks passed");
        checks
    }

    fn hex(s: &str) -> Vec<u8> {
        assert!(s.len().is_multiple_of(2));
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
            .collect()
    }

    #[test]
    fn python_3_8() {
        assert!(fixture(8, include_str!("testdata/lines-3.8.json")) > 1000);
    }

    #[test]
    fn python_3_9() {
        assert!(fixture(9, include_str!("testdata/lines-3.9.json")) > 1000);
    }

    #[test]
    fn python_3_10() {
        assert!(fixture(10, include_str!("testdata/lines-3.10.json")) > 1000);
    }

    #[test]
    fn python_3_11() {
        assert!(fixture(11, include_str!("testdata/lines-3.11.json")) > 1000);
    }

    #[test]
    fn python_3_12() {
        assert!(fixture(12, include_str!("testdata/lines-3.12.json")) > 1000);
    }

    #[test]
    fn python_3_13() {
        assert!(fixture(13, include_str!("testdata/lines-3.13.json")) > 1000);
    }

    #[test]
    fn hand_made_tables() {
        // 3.8: (0, +1), then 10 bytes later, line -1.
        assert_eq!(line_for(8, &[0, 1, 10, 0xff], 5, 0), Some(6));
        assert_eq!(line_for(8, &[0, 1, 10, 0xff], 5, 9), Some(6));
        assert_eq!(line_for(8, &[0, 1, 10, 0xff], 5, 10), Some(5));
        assert_eq!(line_for(8, &[], 5, 1_000_000), Some(5));
        // 3.10: [0,4) line +1, [4,6) no line, [6,8) line +2 from the running line.
        let t = [4, 1, 2, 0x80, 2, 2];
        assert_eq!(line_for(10, &t, 10, 2), Some(11));
        assert_eq!(line_for(10, &t, 10, 4), None);
        assert_eq!(line_for(10, &t, 10, 6), Some(13));
        assert_eq!(line_for(10, &t, 10, 8), None);
        // 3.11: one-line form +1 (2 units), no-location (1 unit), no-column -3 (1 unit).
        let t = [0x80 | (11 << 3) | 1, 0, 0, 0xf8, 0x80 | (13 << 3), 7];
        assert_eq!(line_for(11, &t, 10, 0), Some(11));
        assert_eq!(line_for(11, &t, 10, 2), Some(11));
        assert_eq!(line_for(11, &t, 10, 4), None);
        assert_eq!(line_for(11, &t, 10, 6), Some(8));
        assert_eq!(line_for(11, &t, 10, 8), None);
        // A long varint: 0x41 0x01 is 1 + (1 << 6) = 65, i.e. -32.
        let t = [0x80 | (13 << 3), 0x41, 0x01];
        assert_eq!(line_for(12, &t, 100, 0), Some(68));
        // Unsupported minors.
        assert_eq!(line_for(7, &[0, 1], 1, 0), None);
        assert_eq!(line_for(14, &[0x80], 1, 0), None);
    }

    #[test]
    fn negative_and_overflowing_lines() {
        assert_eq!(line_for(8, &[0, 0x80], 0, 0), None);
        assert_eq!(
            line_for(9, &[0, 127], i32::MAX, 0),
            Some(i32::MAX as u32 + 127)
        );
        assert_eq!(line_for(10, &[2, 0x81], i32::MIN, 0), None);
        // Long form, line delta 0x3fff_ffff >> 1 negated: below zero from i32::MIN + 1.
        let t = [0x80 | (14 << 3), 0x7f, 0x7f, 0x7f, 0x7f, 0x3f, 0, 0, 0];
        assert_eq!(line_for(13, &t, i32::MIN + 1, 0), None);
        assert_eq!(
            line_for(13, &t, i32::MAX, 0),
            Some(i32::MAX as u32 - 0x1fff_ffff)
        );
        // Varints longer than 32 bits lose their top chunks instead of overflowing.
        let t = [
            0x80 | (13 << 3),
            0x7e,
            0x7f,
            0x7f,
            0x7f,
            0x7f,
            0x7f,
            0x7f,
            0x3f,
        ];
        let _ = line_for(11, &t, i32::MAX, 0);
    }

    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    #[test]
    fn garbage_never_panics() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let firstlines = [0, 1, -1, i32::MAX, i32::MIN, i32::MAX - 1, i32::MIN + 1];
        let offsets = [0, 1, 2, 7, 254, 255, 256, 4096, u32::MAX - 1, u32::MAX];
        let mut table = Vec::new();
        for round in 0..10_000 {
            table.clear();
            let len = (rng.next() % 64) as usize;
            // Some rounds bias towards bytes with continuation bits, long varints and -128.
            let mode = round % 4;
            for _ in 0..len {
                let b = rng.next() as u8;
                table.push(match mode {
                    1 => b | 0x40,
                    2 => [0x80, 0x7f, 0xff, 0x00, 0xf8, 0xf0, 0x70][(b % 7) as usize],
                    3 => b & 0x7f,
                    _ => b,
                });
            }
            let firstlineno = firstlines[(rng.next() % firstlines.len() as u64) as usize];
            for minor in 0..=15u8 {
                for &offset in &offsets {
                    let _ = line_for(minor, &table, firstlineno, offset);
                }
                let _ = line_for(minor, &table, firstlineno, rng.next() as u32);
                // Every truncation of the table too.
                for cut in 0..table.len() {
                    let _ = line_for(minor, &table[..cut], firstlineno, rng.next() as u32 % 512);
                }
            }
        }
    }

    #[test]
    fn truncated_real_tables_never_panic() {
        let fixtures = [
            (8, include_str!("testdata/lines-3.8.json")),
            (10, include_str!("testdata/lines-3.10.json")),
            (11, include_str!("testdata/lines-3.11.json")),
            (13, include_str!("testdata/lines-3.13.json")),
        ];
        for (minor, text) in fixtures {
            let doc: serde_json::Value = serde_json::from_str(text).expect("fixture parses");
            for code in doc["code"].as_array().expect("code array") {
                let table = hex(code["table"].as_str().expect("table"));
                let units = code["lines"].as_array().expect("lines").len() as u32;
                // About 40 cuts and 20 offsets per table keep this quick in debug builds.
                let cut_step = table.len() / 40 + 1;
                let unit_step = (units / 20 + 1) as usize;
                for cut in (0..=table.len()).step_by(cut_step) {
                    for unit in (0..units + 4).step_by(unit_step) {
                        let _ = line_for(minor, &table[..cut], i32::MAX, 2 * unit);
                        let _ = line_for(minor, &table[cut..], i32::MIN, 2 * unit);
                    }
                }
            }
        }
    }
}
