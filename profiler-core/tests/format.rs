//! The recording file: round trips, truncation, corruption, version checks and a byte fuzzer.
mod common;

use common::{encode, fixture, frame_offsets};
use profiler_core::recording::format::{FORMAT_VERSION, HEADER_LEN, MAX_PAYLOAD_BYTES};
use profiler_core::{FormatError, RecordReader, Truncation, load_reader, read_recording};

#[test]
fn round_trip() {
    let records = fixture();
    let file = encode(&records);
    assert_eq!(&file[..8], b"STALLREC");
    assert_eq!(u16::from_le_bytes([file[8], file[9]]), FORMAT_VERSION);
    let rec = read_recording(file.as_slice()).unwrap();
    assert_eq!(rec.records, records);
    assert_eq!(rec.truncated, None);
    assert_eq!(rec.unknown_records, 0);

    let streamed: Result<Vec<_>, _> = RecordReader::new(file.as_slice()).unwrap().collect();
    assert_eq!(streamed.unwrap(), records);
}

#[test]
fn header_only_is_an_empty_recording() {
    let file = encode(&[]);
    assert_eq!(file.len(), HEADER_LEN);
    let rec = read_recording(file.as_slice()).unwrap();
    assert!(rec.records.is_empty());
    assert_eq!(rec.truncated, None);
}

#[test]
fn truncated_at_every_offset_loads_a_prefix() {
    let records = fixture();
    let file = encode(&records);
    let offsets = frame_offsets(&file);
    for cut in 0..file.len() {
        let rec = read_recording(&file[..cut]).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let complete = offsets.iter().skip(1).filter(|&&o| o <= cut).count();
        let complete = if cut == file.len() {
            records.len()
        } else {
            complete
        };
        assert_eq!(rec.records, records[..complete], "cut at {cut}");
        let expected_offset = if cut < HEADER_LEN {
            0
        } else {
            offsets[complete] as u64
        };
        match rec.truncated {
            // A cut exactly on a frame boundary is indistinguishable from a clean end.
            None => assert!(cut == offsets[complete], "cut at {cut} not reported"),
            Some(t) => assert_eq!(
                t,
                Truncation {
                    offset: expected_offset,
                    records_loaded: complete as u64
                },
                "cut at {cut}"
            ),
        }
    }
}

#[test]
fn damaged_last_frame_is_a_truncation() {
    let records = fixture();
    let mut file = encode(&records);
    let last = *frame_offsets(&file).last().unwrap();
    let end = file.len() - 1;
    file[end] ^= 0xff;
    let rec = read_recording(file.as_slice()).unwrap();
    assert_eq!(rec.records, records[..records.len() - 1]);
    assert_eq!(
        rec.truncated,
        Some(Truncation {
            offset: last as u64,
            records_loaded: records.len() as u64 - 1
        })
    );
}

#[test]
fn flipped_byte_in_the_middle_is_corrupt_with_offset() {
    let file = encode(&fixture());
    let offsets = frame_offsets(&file);
    let victim = offsets[offsets.len() / 2];
    let mut damaged = file.clone();
    damaged[victim + 8] ^= 0x55; // first payload byte
    match read_recording(damaged.as_slice()) {
        Err(FormatError::Corrupt { offset, reason }) => {
            assert_eq!(offset, victim as u64);
            assert!(reason.contains("crc"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    // Streaming reports the same, after yielding the records before it.
    let mut reader = RecordReader::new(damaged.as_slice()).unwrap();
    let mut before = 0;
    let err = loop {
        match reader.next_record() {
            Ok(Some(_)) => before += 1,
            Ok(None) => panic!("no error"),
            Err(e) => break e,
        }
    };
    assert_eq!(before, offsets.len() / 2);
    assert!(matches!(err, FormatError::Corrupt { .. }));
    assert!(
        reader.next_record().unwrap().is_none(),
        "finished after an error"
    );
    assert!(matches!(
        load_reader(damaged.as_slice()),
        Err(FormatError::Corrupt { .. })
    ));
}

#[test]
fn absurd_length_in_the_middle_is_corrupt() {
    let records = fixture();
    let mut file = encode(&records);
    let offsets = frame_offsets(&file);
    let victim = offsets[3];
    // Pad the file so the absurd length fits inside it: the frame is not at the end.
    let absurd = (MAX_PAYLOAD_BYTES + 1) as u32;
    file[victim..victim + 4].copy_from_slice(&absurd.to_le_bytes());
    file.resize(victim + 8 + absurd as usize + 100, 0);
    match read_recording(file.as_slice()) {
        Err(FormatError::Corrupt { offset, reason }) => {
            assert_eq!(offset, victim as u64);
            assert!(reason.contains("cap"), "{reason}");
        }
        other => panic!("expected Corrupt, got {:?}", other.map(|r| r.records.len())),
    }
    // The same length running past the end of the file is a truncation.
    file.truncate(victim + 100);
    let rec = read_recording(file.as_slice()).unwrap();
    assert_eq!(rec.records.len(), 3);
    assert_eq!(rec.truncated.map(|t| t.offset), Some(victim as u64));
}

#[test]
fn wrong_magic() {
    assert!(matches!(
        read_recording(&b"NOTSTALLxxxxxxxxxxxx"[..]),
        Err(FormatError::NotARecording)
    ));
    assert!(matches!(
        read_recording(&b"{\"json\": true}"[..]),
        Err(FormatError::NotARecording)
    ));
    assert!(matches!(
        read_recording(&b"X"[..]),
        Err(FormatError::NotARecording)
    ));
}

#[test]
fn future_version() {
    let mut file = encode(&fixture());
    file[8..10].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    match read_recording(file.as_slice()) {
        Err(FormatError::UnsupportedVersion { found, supported }) => {
            assert_eq!((found, supported), (FORMAT_VERSION + 1, FORMAT_VERSION));
        }
        other => panic!("expected UnsupportedVersion, got {other:?}"),
    }
}

/// A frame as a newer writer would write it: a record variant this reader does not know.
fn unknown_frame() -> Vec<u8> {
    let payload = [200u8, 1, 0x2a, 3, b'n', b'e', b'w'];
    let mut frame = Vec::new();
    frame.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    frame.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
    frame.extend_from_slice(&payload);
    frame
}

#[test]
fn unknown_record_kinds_are_counted_and_skipped() {
    let records = fixture();
    let file = encode(&records);
    let offsets = frame_offsets(&file);
    let mut mixed = file[..offsets[2]].to_vec();
    mixed.extend(unknown_frame());
    mixed.extend_from_slice(&file[offsets[2]..]);
    mixed.extend(unknown_frame()); // also as the very last frame
    let rec = read_recording(mixed.as_slice()).unwrap();
    assert_eq!(rec.records, records);
    assert_eq!(rec.unknown_records, 2);
    assert_eq!(rec.truncated, None);
    let (_, info) = load_reader(mixed.as_slice()).unwrap();
    assert_eq!(info.unknown_records, 2);
    assert_eq!(info.records, records.len() as u64);
}

/// Tiny deterministic PRNG, so the fuzzer needs no dependency and failures reproduce.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Reads, analyses and renders; must never panic whatever the bytes.
fn exercise(bytes: &[u8]) {
    let _ = read_recording(bytes);
    if let Ok((folded, info)) = load_reader(bytes) {
        let done = folded.analyzed(info);
        let _ = profiler_core::report::text::to_text(&done.report());
        let _ = profiler_core::report::json::to_json_value(&done.report());
        let _ = profiler_core::report::flamegraph::on_cpu_folded(&done.analysis);
        let _ = profiler_core::report::flamegraph::off_cpu_folded(&done.analysis);
    }
}

#[test]
fn random_byte_mutations_never_panic() {
    let file = encode(&fixture());
    let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
    for _ in 0..10_000 {
        let mut bytes = file.clone();
        for _ in 0..1 + rng.below(4) {
            let at = rng.below(bytes.len());
            bytes[at] = rng.next() as u8;
        }
        if rng.below(4) == 0 {
            let cut = rng.below(bytes.len());
            bytes.truncate(cut);
        }
        exercise(&bytes);
    }
}

#[test]
fn mutated_payloads_with_valid_crc_never_panic() {
    // Fixing up the crc after mutating lets garbage reach the decoder and the analysis.
    let file = encode(&fixture());
    let offsets = frame_offsets(&file);
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    // Fewer rounds than the byte fuzzer: each one runs the whole analysis and reports.
    for _ in 0..3_000 {
        let mut bytes = file.clone();
        let frame = offsets[rng.below(offsets.len())];
        let len = u32::from_le_bytes(bytes[frame..frame + 4].try_into().unwrap()) as usize;
        let payload = frame + 8..frame + 8 + len;
        for _ in 0..1 + rng.below(3) {
            let at = payload.start + rng.below(len);
            bytes[at] = match rng.below(3) {
                0 => 0xff,
                1 => rng.next() as u8,
                _ => bytes[at] ^ (1 << rng.below(8)),
            };
        }
        let crc = crc32fast::hash(&bytes[payload]);
        bytes[frame + 4..frame + 8].copy_from_slice(&crc.to_le_bytes());
        exercise(&bytes);
    }
}
