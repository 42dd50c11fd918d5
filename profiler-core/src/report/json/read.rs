//! Reading a JSON report back. Its version is read first, so a report of another version is
//! named as such, with both versions, instead of being misread field by field.
use serde::Deserialize;

use super::{JSON_VERSION, JsonReport};

/// A JSON report read back: it owns its data.
pub type ReportDoc = JsonReport<'static>;

/// A file that could not be read as a run: which file, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {reason}")]
pub struct ReadError {
    pub file: String,
    pub reason: String,
}

impl ReadError {
    pub fn new(file: &str, reason: impl Into<String>) -> Self {
        ReadError {
            file: file.to_owned(),
            reason: reason.into(),
        }
    }
}

#[derive(Deserialize)]
struct Versioned {
    version: Option<serde_json::Value>,
}

/// Whether `bytes` are a JSON report of the version this stallscope reads.
pub fn check_version(bytes: &[u8], file: &str) -> Result<(), ReadError> {
    let head: Versioned = serde_json::from_slice(bytes).map_err(|e| {
        ReadError::new(file, format!("neither a recording nor a JSON report ({e})"))
    })?;
    match head.version {
        None => Err(ReadError::new(
            file,
            "not a stallscope JSON report (no \"version\")",
        )),
        Some(v) if v.as_u64() == Some(u64::from(JSON_VERSION)) => Ok(()),
        Some(v) => Err(ReadError::new(
            file,
            format!("a JSON report of version {v}; this stallscope reads version {JSON_VERSION}"),
        )),
    }
}

/// One recording's JSON report (`report --format json`), typed.
pub fn read_report(bytes: &[u8], file: &str) -> Result<ReportDoc, ReadError> {
    check_version(bytes, file)?;
    serde_json::from_slice(bytes).map_err(|e| {
        ReadError::new(
            file,
            format!("a version {JSON_VERSION} JSON report that does not read as one: {e}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_version_is_named_with_both_versions() {
        let e = read_report(br#"{"version": 7, "gpus": []}"#, "old.json").unwrap_err();
        assert_eq!(e.file, "old.json");
        assert!(
            e.reason.contains("version 7") && e.reason.contains(&format!("version {JSON_VERSION}"))
        );
        let e = read_report(br#"{"gpus": []}"#, "x.json").unwrap_err();
        assert!(e.reason.contains("no \"version\""), "{e}");
        let e = read_report(b"\x00garbage", "x.bin").unwrap_err();
        assert!(
            e.reason
                .starts_with("neither a recording nor a JSON report"),
            "{e}"
        );
    }

    #[test]
    fn a_report_written_before_a_field_was_added_reads_with_the_default() {
        let doc = read_report(
            br#"{"version": 1, "duration_ns": 5, "gpus": [{"index": 2, "observed_ns": 9,
                 "idle_by_cause": {"disk": 4}, "seconds": []}]}"#,
            "old.json",
        )
        .unwrap();
        assert_eq!(doc.duration_ns, 5);
        assert_eq!(doc.gpus[0].index, 2);
        assert!(doc.gpus[0].lost_by_cause.is_empty() && doc.gpus[0].waiting.is_none());
        assert_eq!(doc.gpus[0].idle_by_cause["disk"], 4);
    }

    #[test]
    fn a_field_of_the_wrong_type_is_an_error_that_names_the_file() {
        let e = read_report(br#"{"version": 1, "duration_ns": "long"}"#, "bad.json").unwrap_err();
        assert_eq!(e.file, "bad.json");
        assert!(
            e.reason.contains("duration_ns") || e.reason.contains("invalid type"),
            "{e}"
        );
    }
}
