//! The recording file as the seam between `record` and `report`: a live report and a later
//! one agree, and damaged files are handled without panics.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use common::{
    Scratch, serial,
    spawned::Spawned,
    stallscope::{
        REPORT_TIMEOUT, Recording, assert_clean_error, assert_no_panic, assert_success, command,
        parse_report, record, report,
    },
    workload::Workload,
};
use serde_json::Value;

/// The file layout (profiler-core's format module): a 12-byte header, then frames of
/// `u32 LE length`, `u32 LE crc32`, payload.
const HEADER_LEN: usize = 12;
const FRAME_HEADER_LEN: usize = 8;

/// Start offset and payload length of each frame.
fn frames(bytes: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = HEADER_LEN;
    while at + FRAME_HEADER_LEN <= bytes.len() {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
        out.push((at, len));
        at += FRAME_HEADER_LEN + len;
    }
    assert_eq!(
        at,
        bytes.len(),
        "a finished recording should end on a frame boundary"
    );
    out
}

/// A 2 s recording of a spinner: ticks, samples and stacks, a bit of everything.
fn sample_recording() -> (Workload, Recording) {
    let w = Workload::start(&["spin", "--secs", "20"]);
    let rec = record(&[w.pid], "2s");
    (w, rec)
}

fn write_variant(dir: &Scratch, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// A cut-short file must load what it can and say so, or be refused with a clear error.
fn check_truncated(path: &Path, what: &str, at_frame_boundary: bool) {
    let f = report(path, true);
    assert_no_panic(&f, what);
    eprintln!("{what}: exit {:?}: {}", f.code(), f.stderr.trim());
    if f.code() == Some(1) {
        assert_clean_error(&f, what);
        return;
    }
    assert_success(&f, what);
    let report = parse_report(&f.stdout);
    if at_frame_boundary {
        // Nothing in the file itself is damaged; what is missing is the end record.
        assert_eq!(report["ended"], false, "{what}: the end record is gone");
    } else {
        assert!(
            f.stderr.contains("cut short"),
            "{what}: a cut-short file should be reported as such:\n{}",
            f.describe()
        );
        assert!(
            !report["truncated"].is_null(),
            "{what}: `truncated` should be set"
        );
    }
}

#[test]
fn truncated_recordings_load_what_they_can() {
    let _serial = serial();
    let (_w, rec) = sample_recording();
    let bytes = std::fs::read(&rec.file).unwrap();
    let frames = frames(&bytes);
    assert!(frames.len() > 10, "expected a recording of many records");
    let (mid, mid_len) = frames[frames.len() / 2];
    let cuts = [
        (0, "empty file", false),
        (5, "inside the magic", false),
        (HEADER_LEN + 3, "inside the first frame header", false),
        (
            mid + FRAME_HEADER_LEN + mid_len / 2,
            "inside a middle frame",
            false,
        ),
        (bytes.len() - 1, "one byte short", false),
        (mid, "on a frame boundary", true),
    ];
    let dir = Scratch::new("truncated");
    for (at, name, boundary) in cuts {
        let path = write_variant(&dir, "cut.rec", &bytes[..at]);
        check_truncated(
            &path,
            &format!("report of a recording cut at byte {at} ({name})"),
            boundary,
        );
    }
    // The text report takes its own path through the damage.
    let path = write_variant(&dir, "cut.rec", &bytes[..bytes.len() - 1]);
    let f = report(&path, false);
    assert_success(&f, "text report of a cut-short recording");
    assert!(f.stderr.contains("cut short"), "{}", f.describe());
}

#[test]
fn corrupt_recordings_are_refused_without_panics() {
    let _serial = serial();
    let (_w, rec) = sample_recording();
    let bytes = std::fs::read(&rec.file).unwrap();
    let frames = frames(&bytes);
    let dir = Scratch::new("corrupt");

    // One flipped byte in the payload of a frame in the middle, with good frames after it.
    let (mid, mid_len) = frames[frames.len() / 2];
    assert!(mid_len > 0);
    let mut damaged = bytes.clone();
    damaged[mid + FRAME_HEADER_LEN + mid_len / 2] ^= 0xff;
    let path = write_variant(&dir, "flipped.rec", &damaged);
    let f = report(&path, true);
    assert_clean_error(&f, "report of a recording with a flipped byte");
    assert!(
        f.stderr.contains("corrupt"),
        "the error should say the recording is corrupt:\n{}",
        f.describe()
    );

    // Wherever the damage falls (lengths, crcs, payloads), the outcome is a report or a
    // clear error.
    for i in 1..40 {
        let at = HEADER_LEN + (bytes.len() - HEADER_LEN) * i / 40;
        let mut damaged = bytes.clone();
        damaged[at] ^= 0x5a;
        let path = write_variant(&dir, "fuzz.rec", &damaged);
        let f = report(&path, true);
        let what = format!("report of a recording with byte {at} flipped");
        assert_no_panic(&f, &what);
        match f.code() {
            Some(0) => {
                parse_report(&f.stdout);
            }
            _ => assert_clean_error(&f, &what),
        }
    }
}

#[test]
fn report_of_the_file_equals_the_live_report() {
    let _serial = serial();
    let (_w, rec) = sample_recording();
    // Flamegraphs go next to the recording by default, and to --flamegraph-dir on request.
    let live_folded = rec.dir.join("x.oncpu.folded");
    for name in ["x.oncpu.folded", "x.oncpu.svg"] {
        assert!(
            rec.dir.join(name).is_file(),
            "record should write {name} next to x.rec"
        );
    }
    let elsewhere = Scratch::new("flamegraphs");
    let mut cmd = command();
    cmd.arg("report")
        .arg(&rec.file)
        .arg("--json")
        .arg("--flamegraph-dir")
        .arg(&elsewhere.path);
    let later = Spawned::start(&mut cmd).finish(REPORT_TIMEOUT);
    assert_success(&later, "stallscope report");
    assert_eq!(
        std::fs::read_to_string(elsewhere.join("x.oncpu.folded")).unwrap(),
        std::fs::read_to_string(&live_folded).unwrap(),
        "the folded on-CPU stacks of `report` differ from the live ones"
    );
    if later.stdout != rec.finished.stdout {
        let live = parse_report(&rec.finished.stdout);
        let replayed = parse_report(&later.stdout);
        panic!(
            "`report --json` differs from the live `record --json`; first difference: {}",
            first_difference(&live, &replayed, "")
        );
    }
}

/// Where two JSON values first differ, as a path and both sides.
fn first_difference(a: &Value, b: &Value, path: &str) -> String {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let (va, vb) = (
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                );
                if va != vb {
                    return first_difference(va, vb, &format!("{path}.{k}"));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                if va != vb {
                    return first_difference(va, vb, &format!("{path}[{i}]"));
                }
            }
        }
        _ => {}
    }
    format!("{path}: live {a} vs report {b}")
}
