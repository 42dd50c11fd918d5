//! What the fuzz targets run, kept apart from `libfuzzer-sys` so that
//! `profiler-core/tests/fuzz_regressions.rs` can include this very file (`#[path]`) and replay
//! the corpus and the regressions through exactly the same code.
//!
//! - [`decode`]: the streaming reader over arbitrary bytes, read twice (from one slice, where
//!   most frames take the in-buffer fast path, and a few bytes per `read`, where every frame
//!   takes the careful path), checking that both readings agree and that the reader's
//!   bookkeeping stays inside the input; then the same again with every frame's crc made
//!   valid ([`with_valid_crcs`]), so that mutated payloads reach the record decoder.
//! - [`report`]: what `stallscope report` does with a file (profiler/src/output.rs): load,
//!   attribute, fold every flame graph's stacks, draw one SVG, write the text and the JSON
//!   report. The input is [`reframe`]d first: a mutation almost never keeps a frame's crc
//!   right, and one that makes a field longer (a big number is a longer varint) shifts every
//!   frame after it; either way nearly every input would stop at the first mutated frame
//!   instead of reaching the analysis.
use std::io::{self, Read};

use profiler_core::pipeline::{self, Keep};
use profiler_core::recording::format::{FRAME_HEADER_LEN, HEADER_LEN};
use profiler_core::recording::record::Record;
use profiler_core::report::flamegraph::{
    self as folded, cause_lines, off_cpu_folded, on_cpu_folded,
};
use profiler_core::{Destination, Format, FormatError, Inputs, RecordReader, Subject, Truncation};

/// Everything one reading of a recording gave.
#[derive(Debug, PartialEq)]
pub struct Decoded {
    pub records: Vec<Record>,
    /// The error that ended the reading, as displayed (it names the offset).
    pub error: Option<String>,
    pub truncated: Option<Truncation>,
    pub unknown_records: u64,
    pub records_read: u64,
    pub offset: u64,
}

/// Reads `r` to the end, or to its first error; `Err` when the header is refused.
pub fn read_all<R: Read>(r: R) -> Result<Decoded, FormatError> {
    let mut reader = RecordReader::new(r)?;
    let mut records = Vec::new();
    let mut error = None;
    for item in &mut reader {
        match item {
            Ok(record) => records.push(record),
            Err(e) => error = Some(e.to_string()),
        }
    }
    // An error is yielded once and ends the iteration; the reader stays finished.
    assert!(
        reader.next().is_none(),
        "the reader yielded more after its end"
    );
    Ok(Decoded {
        records,
        error,
        truncated: reader.truncation(),
        unknown_records: reader.unknown_records(),
        records_read: reader.records_read(),
        offset: reader.offset(),
    })
}

/// A source that hands out at most `chunk` bytes per `read`, as a pipe or a slow disk might.
pub struct Trickle<'a> {
    data: &'a [u8],
    chunk: usize,
}

impl<'a> Trickle<'a> {
    pub fn new(data: &'a [u8], chunk: usize) -> Self {
        Self {
            data,
            chunk: chunk.max(1),
        }
    }
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.chunk).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// `data` with the crc of every frame that lies wholly inside it recomputed; a frame cut short
/// by the end is left as it is. Idempotent, and a no-op on a well-formed recording.
pub fn with_valid_crcs(data: &[u8]) -> Vec<u8> {
    let mut out = data.to_vec();
    let mut at = HEADER_LEN;
    while let Some(header) = out.get(at..at + FRAME_HEADER_LEN) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let start = at + FRAME_HEADER_LEN;
        let Some(end) = start.checked_add(len).filter(|&end| end <= out.len()) else {
            break;
        };
        let crc = crc32fast::hash(&out[start..end]);
        out[at + 4..at + 8].copy_from_slice(&crc.to_le_bytes());
        at = end;
    }
    out
}

/// The decode target: any bytes, every record or error; never a panic, and the same answer
/// however the bytes arrive. Runs on the bytes as given, then with their crcs made valid.
pub fn decode(data: &[u8]) {
    decode_both_ways(data);
    let fixed = with_valid_crcs(data);
    if fixed != data {
        decode_both_ways(&fixed);
    }
}

fn decode_both_ways(data: &[u8]) {
    let whole = read_all(data);
    // The chunk size comes from the input, so the fuzzer explores it too.
    let chunk = 1 + usize::from(data.last().copied().unwrap_or(0) % 13);
    let trickled = read_all(Trickle::new(data, chunk));
    match (&whole, &trickled) {
        (Ok(a), Ok(b)) => {
            assert_eq!(a, b, "the reading depends on how the bytes arrive");
            let len = data.len() as u64;
            assert!(a.offset <= len, "offset {} past the end {len}", a.offset);
            assert_eq!(a.records_read, a.records.len() as u64);
            if let Some(t) = a.truncated {
                assert!(
                    t.offset <= len,
                    "truncation at {} past the end {len}",
                    t.offset
                );
                assert_eq!(t.records_loaded, a.records_read);
                assert!(a.error.is_none(), "both truncated and corrupt");
            }
        }
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("header accepted one way only: {whole:?} vs {trickled:?}"),
    }
}

/// Why [`report`] stopped short: the recording was refused, or rendering failed.
#[derive(Debug)]
pub enum ReportError {
    Load(FormatError),
    Render(String),
}

/// How many flame graphs had stacks, and whether the SVG drawn rendered.
#[derive(Debug, Default)]
pub struct Rendered {
    pub graphs: usize,
    pub svg_bytes: usize,
}

/// `data` made into frames that hold what the records in it decode to: each frame's payload
/// is as long as the record that decodes from its start (its declared length when none does,
/// if the file has that many bytes: a record kind the reader skips), with its crc computed.
/// The header and a cut-short last frame stay as they are. A well-formed recording comes out
/// unchanged.
pub fn reframe(data: &[u8]) -> Vec<u8> {
    let Some(header) = data.get(..HEADER_LEN) else {
        return data.to_vec();
    };
    let mut out = header.to_vec();
    let mut at = HEADER_LEN;
    while let Some(frame) = data.get(at..at + FRAME_HEADER_LEN) {
        let declared = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
        let payload = &data[at + FRAME_HEADER_LEN..];
        let len = match postcard::take_from_bytes::<Record>(payload) {
            Ok((_, rest)) => payload.len() - rest.len(),
            Err(_) if declared <= payload.len() => declared,
            Err(_) => break,
        };
        let payload = &payload[..len];
        out.extend_from_slice(&(len as u32).to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        out.extend_from_slice(payload);
        at += FRAME_HEADER_LEN + len;
    }
    out.extend_from_slice(&data[at..]);
    out
}

/// Values [`mutate_numbers`] sets fields to: where sums, products and time spans overflow,
/// and where per-second or per-tick loops would run for years.
const EDGE_VALUES: [u64; 18] = [
    0,
    1,
    100,
    101,
    1_000_000_000,
    1 << 31,
    u32::MAX as u64,
    1 << 32,
    1_000_000_000_000_000,
    100_000_000_000_000_000,
    1 << 60,
    (1 << 63) - 1,
    1 << 63,
    u64::MAX / 100 + 1,
    u64::MAX - 1_000_000_000,
    u64::MAX - 100,
    u64::MAX - 1,
    u64::MAX,
];

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The report target's own mutation, beside libFuzzer's byte-level ones: replaces one to three
/// varints (postcard's encoding of every integer field) after the header with edge values or
/// neighbours of their old value, then [`reframe`]s, so that records stay whole while a field
/// becomes huge. Byte mutations seldom manage that: a big number is a longer varint, and
/// writing one over a short one garbles the fields after it. With some luck the same value
/// lands in several fields (a timestamp and a period, say), as a damaged file might have it.
pub fn mutate_numbers(data: &[u8], seed: u32) -> Vec<u8> {
    let mut rng = u64::from(seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let body = HEADER_LEN + FRAME_HEADER_LEN;
    let mut out = data.to_vec();
    let shared = EDGE_VALUES[next() as usize % EDGE_VALUES.len()];
    for _ in 0..1 + next() % 3 {
        if out.len() <= body {
            break;
        }
        let pos = body + next() as usize % (out.len() - body);
        // The varint that `pos` is in: after a byte without the continuation bit, up to and
        // including the next such byte (at most ten bytes).
        let mut start = pos;
        while start > body && out[start - 1] >= 0x80 && pos - start < 9 {
            start -= 1;
        }
        let mut end = pos;
        while end + 1 < out.len() && out[end] >= 0x80 && end - start < 9 {
            end += 1;
        }
        let old = out[start..=end]
            .iter()
            .rev()
            .fold(0u64, |v, b| (v << 7) | u64::from(b & 0x7f));
        let new = match next() % 6 {
            0 | 1 => shared,
            2 => EDGE_VALUES[next() as usize % EDGE_VALUES.len()],
            3 => old.wrapping_add(1 + next() % 4),
            4 => old.wrapping_sub(1 + next() % 4),
            _ => old.wrapping_mul(1 + next() % 1_000_000_000),
        };
        let mut encoded = Vec::with_capacity(10);
        varint(new, &mut encoded);
        out.splice(start..=end, encoded);
    }
    reframe(&out)
}

/// The report target: [`reframe`], then the chain `stallscope report` runs on a file
/// ([`report_chain`]).
pub fn report(data: &[u8]) -> Result<Rendered, ReportError> {
    report_chain(&reframe(data))
}

/// What `stallscope report` runs on a file, with every output sent to a sink. One flame graph
/// is drawn as SVG (which one the input's last byte picks): drawing them all would take most
/// of each run's time in inferno.
pub fn report_chain(data: &[u8]) -> Result<Rendered, ReportError> {
    let loaded = pipeline::load("fuzz", data).map_err(ReportError::Load)?;
    // As profiler/src/output.rs: the pipeline keeps each cause's stacks and frees the timed
    // samples before the reports are written.
    let keep = Keep {
        cause_stacks: true,
        timeline: false,
    };
    let calibration = pipeline::calibrate(&[&loaded]);
    let (analyzed, mut graphs) = pipeline::attribute(loaded, &calibration, keep, |a| {
        vec![
            (on_cpu_folded(a), "samples", "On-CPU".to_owned()),
            (off_cpu_folded(a), "us", "Off-CPU".to_owned()),
        ]
    });
    let analysis = &analyzed.analysis;
    for stacks in analyzed.causes.iter().filter(|s| !s.is_empty()) {
        let (lines, unit) = cause_lines(analysis, stacks);
        graphs.push((
            lines,
            unit,
            format!("GPU idle time: {}", stacks.cause().name()),
        ));
    }

    graphs.retain(|(lines, _, _)| !lines.is_empty());
    let mut rendered = Rendered {
        graphs: graphs.len(),
        svg_bytes: 0,
    };
    for (lines, _, _) in &graphs {
        folded::write_folded(lines, io::sink()).map_err(|e| ReportError::Render(e.to_string()))?;
    }
    if !graphs.is_empty() {
        let pick = usize::from(data.last().copied().unwrap_or(0)) % graphs.len();
        let (lines, unit, title) = &graphs[pick];
        let mut svg = Counter(0);
        folded::flamegraph_svg(lines, title, unit, &mut svg)
            .map_err(|e| ReportError::Render(format!("flame graph {title}: {e}")))?;
        rendered.svg_bytes = svg.0;
    }
    let report = analyzed.report();
    // Every stdout format: they render from the report alone (the timeline's need kept events,
    // the flame graphs are drawn above).
    for format in Format::ALL
        .into_iter()
        .filter(|f| f.destination() == Destination::Stdout)
    {
        let renderer = format
            .renderer()
            .ok_or_else(|| ReportError::Render(format!("no {format} renderer")))?;
        renderer
            .render(&Inputs::report(Subject::One(&report)), &mut io::sink())
            .map_err(|e| ReportError::Render(format!("{format} report: {e}")))?;
    }
    Ok(rendered)
}

/// A sink that counts what it is given.
struct Counter(usize);

impl io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
