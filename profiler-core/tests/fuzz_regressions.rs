//! Replays the fuzzers' seed corpus and every input they ever crashed on (`fuzz/regressions/`)
//! through the very code the fuzz targets run (`fuzz/src/lib.rs`, included below): the decode
//! target's checks and the whole `stallscope report` chain. Nothing may panic.
//!
//! Also checks that the valid seeds are what the corpus promises: they load cleanly, the GPU
//! ones get attributed, and together they hold every record kind.
use std::collections::BTreeSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

#[path = "../../fuzz/src/lib.rs"]
#[allow(
    dead_code,
    reason = "the fuzz library's mutator serves libFuzzer, not these tests"
)]
mod chain;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `dir` (relative to fuzz/), sorted by name; README files are not inputs.
fn inputs(dir: &str) -> Vec<(String, Vec<u8>)> {
    let dir = fuzz_dir().join(dir);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("reading a directory entry").path())
        .filter(|p| {
            p.is_file()
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("README"))
        })
        .map(|p| {
            let name = p
                .file_name()
                .expect("a file name")
                .to_string_lossy()
                .into_owned();
            let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (name, bytes)
        })
        .collect();
    out.sort();
    out
}

/// Runs both targets on every input; the names of those that panicked, with the message.
fn replay(inputs: &[(String, Vec<u8>)]) -> Vec<String> {
    let mut failed = Vec::new();
    for (name, bytes) in inputs {
        for (target, run) in [
            ("decode", chain::decode as fn(&[u8])),
            ("report", |b: &[u8]| {
                let _ = chain::report(b);
            }),
            // The bytes as they are, crcs and all, as `stallscope report` would read the file.
            ("report (crcs as given)", |b: &[u8]| {
                let _ = chain::report_chain(b);
            }),
        ] {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| run(bytes))) {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                failed.push(format!("{target} target on {name}: {msg}"));
            }
        }
    }
    failed
}

#[test]
fn regressions_never_panic() {
    let regressions = inputs("regressions");
    let failed = replay(&regressions);
    assert!(failed.is_empty(), "panics:\n{}", failed.join("\n"));
}

#[test]
fn seed_corpus_never_panics() {
    for target in ["decode", "report"] {
        let seeds = inputs(&format!("corpus/{target}"));
        assert!(
            seeds.len() >= 10,
            "corpus/{target} has {} seeds",
            seeds.len()
        );
        let failed = replay(&seeds);
        assert!(failed.is_empty(), "panics:\n{}", failed.join("\n"));
    }
}

/// A record's variant name, from its `Debug` form.
fn kind(r: &profiler_core::recording::record::Record) -> String {
    let debug = format!("{r:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn valid_seeds_load_and_hold_every_record_kind() {
    let mut kinds = BTreeSet::new();
    for (name, bytes) in inputs("corpus/report") {
        if name.starts_with("edge-") {
            continue;
        }
        let decoded = chain::read_all(bytes.as_slice()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(decoded.error, None, "{name}");
        assert_eq!(decoded.truncated, None, "{name}");
        assert_eq!(decoded.offset, bytes.len() as u64, "{name}");
        assert!(
            chain::with_valid_crcs(&bytes) == bytes,
            "{name}: a crc was wrong"
        );
        kinds.extend(decoded.records.iter().map(kind));
        let rendered = match chain::report(&bytes) {
            Ok(r) => r,
            Err(chain::ReportError::Load(e)) => panic!("{name}: {e}"),
            Err(chain::ReportError::Render(e)) => panic!("{name}: {e}"),
        };
        assert!(
            rendered.graphs > 0 && rendered.svg_bytes > 0,
            "{name}: {rendered:?}"
        );
        if name == "gpu-phases" {
            let (folded, _) = profiler_core::load_reader(bytes.as_slice()).expect("loads");
            let attribution = folded.attribute().expect("a GPU recording is attributed");
            let causes = &attribution.gpus[0].idle_by_cause;
            assert!(causes.len() >= 2, "{name}: {causes:?}");
        }
    }
    for want in [
        "Meta",
        "Thread",
        "Process",
        "Tick",
        "ThreadExit",
        "Stack",
        "CpuSample",
        "OffCpuSample",
        "BlockIo",
        "PageCacheFile",
        "Unavailable",
        "Loss",
        "End",
        "Gpu",
        "GpuUtil",
        "GpuState",
        "GpuProcessUtil",
        "Host",
        "CudaLibrary",
        "CudaProbes",
        "CudaCall",
        "Launches",
        "ProcessEnv",
        "Unwinding",
        "PythonStacks",
        "CudaCallSite",
    ] {
        assert!(
            kinds.contains(want),
            "no seed holds a {want} record: {kinds:?}"
        );
    }
}

#[test]
fn damaged_seeds_read_as_documented() {
    let seeds: std::collections::BTreeMap<String, Vec<u8>> =
        inputs("corpus/decode").into_iter().collect();
    let read = |name: &str| chain::read_all(seeds[name].as_slice());
    assert!(matches!(
        read("edge-not-a-recording"),
        Err(profiler_core::FormatError::NotARecording)
    ));
    assert!(matches!(
        read("edge-future-version"),
        Err(profiler_core::FormatError::UnsupportedVersion { .. })
    ));
    for truncated in [
        "edge-empty",
        "edge-short-header",
        "edge-frame-header-cut",
        "edge-payload-cut",
        "edge-bad-crc-last",
        "edge-huge-length-last",
        // Declares more bytes than the file has left: a cut-short frame, wherever it is.
        "edge-huge-length-middle",
    ] {
        let d = read(truncated).unwrap_or_else(|e| panic!("{truncated}: {e}"));
        assert!(
            d.truncated.is_some() && d.error.is_none(),
            "{truncated}: {d:?}"
        );
    }
    let corrupt = "edge-bad-crc-middle";
    let d = read(corrupt).unwrap_or_else(|e| panic!("{corrupt}: {e}"));
    assert!(
        d.error.is_some() && d.truncated.is_none(),
        "{corrupt}: {d:?}"
    );
    let d = read("edge-header-only").expect("a header is a recording");
    assert!(d.records.is_empty() && d.truncated.is_none() && d.error.is_none());
    let d = read("unknown-kind").expect("loads");
    assert_eq!(d.unknown_records, 1);
}
