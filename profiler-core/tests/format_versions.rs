//! Recordings of every format version stay readable. `tests/recordings/vN-*.rec` are kept
//! from each version `N` the recorder has written; each must decode whole, as it did when it
//! was made. And the layout of the current version must not change under its number:
//! `v<FORMAT_VERSION>-fixture.rec` is the shared fixture as this version encodes it, so a
//! change to a record's fields fails here until FORMAT_VERSION is bumped (keeping a reader for
//! the old layout and its files).
mod common;

use std::path::{Path, PathBuf};

use profiler_core::recording::format::{FORMAT_VERSION, HEADER_LEN};

fn recordings() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/recordings");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "rec"))
        .collect();
    files.sort();
    files
}

/// The version a file's name says (`v1-...`).
fn named_version(path: &Path) -> u16 {
    let name = path.file_name().unwrap().to_string_lossy();
    name.strip_prefix('v')
        .and_then(|rest| rest.split('-').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name}: recordings here are named v<version>-<what>.rec"))
}

#[test]
fn every_kept_recording_still_decodes() {
    let files = recordings();
    assert!(
        (1..=FORMAT_VERSION).all(|v| files.iter().any(|f| named_version(f) == v)),
        "a recording of every version up to {FORMAT_VERSION} is kept: {files:?}"
    );
    for path in files {
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > HEADER_LEN, "{}", path.display());
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        assert_eq!(version, named_version(&path), "{}: header", path.display());
        let (folded, load) = profiler_core::load_reader(&bytes[..])
            .unwrap_or_else(|e| panic!("{} no longer decodes: {e}", path.display()));
        assert!(
            load.truncated.is_none(),
            "{}: {:?}",
            path.display(),
            load.truncated
        );
        assert_eq!(load.unknown_records, 0, "{}", path.display());
        let a = &folded.analysis;
        assert!(!a.threads.is_empty(), "{}: no threads", path.display());
        if version == FORMAT_VERSION {
            // Every record reads back as the same bytes: a field added, dropped or retyped
            // since the file was made would not.
            let read = profiler_core::recording::reader::read_recording(&bytes[..]).unwrap();
            assert!(
                common::encode(&read.records) == bytes,
                "{}: its records no longer encode as they were written: the layout changed \
                 under format version {FORMAT_VERSION}",
                path.display()
            );
        }
        let name = path.file_name().unwrap().to_string_lossy();
        if name.contains("stallgen") {
            // A recording of the simulated GPU: samples, CUDA calls and an attribution.
            let attr = folded
                .attribute()
                .unwrap_or_else(|| panic!("{name}: no attribution"));
            assert!(!attr.gpus.is_empty() && attr.gpus[0].idle_ns > 0, "{name}");
            assert!(!a.cuda.calls.is_empty(), "{name}: no CUDA calls");
        }
    }
}

#[test]
fn the_current_layout_has_not_changed_under_its_version() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/recordings/v{FORMAT_VERSION}-fixture.rec"));
    let encoded = common::encode(&common::fixture());
    if std::env::var_os("STALLSCOPE_BLESS").is_some_and(|v| v == "1") && !path.exists() {
        std::fs::write(&path, &encoded).unwrap();
    }
    let kept = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; a new format version keeps its fixture (STALLSCOPE_BLESS=1 writes it once)",
            path.display()
        )
    });
    assert!(
        kept == encoded,
        "the recording layout changed under format version {FORMAT_VERSION}: {} no longer \
         matches what this version writes. Bump FORMAT_VERSION in format.rs, keep reading \
         version {FORMAT_VERSION}'s files, and keep this one",
        path.display()
    );
}
