//! The machine-readable report: a stable JSON document (`"version": 1`).
//!
//! Field names are a contract with scripts and tests: add fields freely, rename none. Lists are
//! sorted (threads by pid then tid) so output is byte-for-byte deterministic.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use super::model::{Inputs, JobReport, Render, Report, Subject};
use crate::analysis::model::EventCounts;
use crate::attribution::ranks::RankView;
use crate::recording::record::EndReason;

/// The report format version, bumped only for incompatible changes.
pub const JSON_VERSION: u32 = 1;

pub mod gpu;
pub mod read;

pub use read::{ReadError, ReportDoc, read_report};

/// The JSON format.
pub struct Json;

impl Render for Json {
    fn render(&self, input: &Inputs<'_, '_>, mut w: &mut dyn Write) -> io::Result<()> {
        match input.subject {
            Subject::One(report) => write_json(report, w).map_err(io::Error::from),
            Subject::Job(job) => {
                serde_json::to_writer_pretty(&mut w, &JsonJob::new(job))?;
                w.write_all(b"\n")
            }
        }
    }
}

/// Writes the report as pretty-printed JSON followed by a newline.
pub fn write_json<W: Write>(report: &Report<'_>, mut w: W) -> Result<(), serde_json::Error> {
    serde_json::to_writer_pretty(&mut w, &JsonReport::new(report))?;
    w.write_all(b"\n").map_err(serde_json::Error::io)
}

/// The report as a JSON value.
pub fn to_json_value(report: &Report<'_>) -> serde_json::Value {
    // Serializing plain structs with string keys into a Value cannot fail.
    serde_json::to_value(JsonReport::new(report)).unwrap_or(serde_json::Value::Null)
}

/// One segment's report, as `record --segment N --format json` writes each segment's: one
/// such document a segment, in order. `R` is the report: [`JsonReport`] when written, what the
/// reader wants when read.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct SegmentDoc<R> {
    pub segment: u32,
    /// The segment's recording file.
    pub recording: String,
    pub report: R,
}

/// Writes segment `segment`'s report, of the recording `recording`, as a [`SegmentDoc`]
/// followed by a newline.
pub fn write_segment<W: Write>(
    report: &Report<'_>,
    segment: u32,
    recording: &str,
    mut w: W,
) -> Result<(), serde_json::Error> {
    let doc = SegmentDoc {
        segment,
        recording: recording.to_owned(),
        report: JsonReport::new(report),
    };
    serde_json::to_writer_pretty(&mut w, &doc)?;
    w.write_all(b"\n").map_err(serde_json::Error::io)
}

/// Several recordings of one job.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonJob<'a> {
    pub version: u32,
    pub recordings: Vec<JsonRecording<'a>>,
    /// The ranks across every recording, and the straggler.
    pub ranks: Cow<'a, RankView>,
    pub clock_note: Cow<'a, str>,
}

impl<'a> JsonJob<'a> {
    pub fn new(job: &'a JobReport<'a>) -> Self {
        JsonJob {
            version: JSON_VERSION,
            recordings: job
                .recordings
                .iter()
                .map(|(file, report)| JsonRecording {
                    file: Cow::Borrowed(file),
                    report: JsonReport::new(report),
                })
                .collect(),
            ranks: Cow::Borrowed(&job.ranks),
            clock_note: Cow::Borrowed(&job.clock_note),
        }
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct JsonRecording<'a> {
    pub file: Cow<'a, str>,
    #[serde(flatten)]
    pub report: JsonReport<'a>,
}

/// The whole document; build with [`JsonReport::new`] and serialize with any serde backend,
/// or read one back with [`read_report`] (a [`ReportDoc`]). A field a report of this version
/// lacks (written before the field was added) reads as its default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonReport<'a> {
    pub version: u32,
    pub target: JsonTarget<'a>,
    pub duration_ns: u64,
    pub start_ns: u64,
    pub start_unix_ns: Option<u64>,
    pub ended: bool,
    pub end_reason: Option<Cow<'a, str>>,
    pub hostname: Option<Cow<'a, str>>,
    pub kernel: Option<Cow<'a, str>>,
    pub sample_hz: Option<u64>,
    pub tick_ns: Option<u64>,
    pub stallscope_version: Option<Cow<'a, str>>,
    pub lost_events: u64,
    pub attempted_events: u64,
    pub events: Cow<'a, BTreeMap<String, EventCounts>>,
    pub threads: Vec<JsonThread<'a>>,
    pub processes: Vec<JsonProcess<'a>>,
    pub page_cache_files: Vec<JsonFile>,
    pub unavailable: Vec<JsonUnavailable<'a>>,
    pub truncated: Option<JsonTruncation>,
    pub unknown_records: u64,
    pub records: u64,
    /// How the stack samples were unwound (absent from recordings made before it was).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unwinding: Option<Cow<'a, crate::recording::record::UnwindStats>>,
    /// How the Python frames were read (absent when the recording says nothing of them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub python: Option<Cow<'a, crate::recording::record::PythonStats>>,
    pub gpus: Vec<gpu::JsonGpu<'a>>,
    /// PID -> the CUDA driver library it mapped, from /proc/PID/maps.
    pub cuda_processes: Cow<'a, BTreeMap<u32, String>>,
    /// What the CUDA and NCCL uprobes saw, per process.
    pub cuda: Cow<'a, crate::cuda::CudaSummary<'a>>,
    /// NCCL ranks in the recording and the straggler, if any.
    pub ranks: Cow<'a, RankView>,
    /// Start and end are CLOCK_MONOTONIC ns, like `start_ns`.
    pub stalls: Vec<Cow<'a, crate::attribution::Stall>>,
    pub verdict: Option<Cow<'a, crate::attribution::Verdict>>,
    /// Causes the recording lacks a signal to judge, with why: not ruled out, not checked.
    pub unchecked_causes: Cow<'a, [crate::attribution::signals::Unchecked]>,
    /// What to change, with numbers, the largest expected gain first.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub advice: Cow<'a, [crate::attribution::Advice]>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonTarget<'a> {
    /// The first target PID.
    pub pid: Option<u32>,
    pub pids: Cow<'a, [u32]>,
    pub command: Cow<'a, [String]>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonThread<'a> {
    pub tid: u32,
    pub pid: u32,
    pub comm: Cow<'a, str>,
    pub on_cpu_ns: u64,
    pub runqueue_ns: u64,
    pub io_wait_ns: u64,
    pub blocked_ns: u64,
    pub lifetime_ns: u64,
    /// Pages.
    pub page_cache_misses: u64,
    pub page_cache_miss_bytes: u64,
    /// Block-IO read bytes issued by this thread.
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub exited: bool,
    pub block_io: JsonBlockIo,
    /// What it blocked in, the most time first; absent where the recording does not say.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub blocked_on: Vec<JsonBlockedOn>,
}

/// One thing a thread blocked in (see [`crate::analysis::model::BlockedOn`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonBlockedOn {
    pub kind: String,
    pub call: String,
    pub detail: String,
    /// Sampled off-CPU time spent in it.
    pub ns: u64,
    /// Who ended those waits, the most time first (see
    /// [`crate::analysis::model::Waker`]); absent when the recording does not say.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub wakers: Vec<JsonWaker>,
}

/// Who ended a thread's waits.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonWaker {
    /// `thread`, `process`, `interrupt` or `timer`.
    pub kind: String,
    pub who: String,
    pub tid: u32,
    pub pid: u32,
    /// Sampled off-CPU time it ended.
    pub ns: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonBlockIo {
    pub count: u64,
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub max_ns: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonProcess<'a> {
    pub pid: u32,
    pub ppid: Option<u32>,
    pub comm: Cow<'a, str>,
    pub cmdline: Cow<'a, str>,
    pub threads: Cow<'a, [u32]>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonFile {
    pub path: Option<String>,
    /// The path, or `dev MAJ:MIN ino N`.
    pub name: String,
    pub dev: u32,
    pub ino: u64,
    pub pages: u64,
    pub bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonUnavailable<'a> {
    pub signal: Cow<'a, str>,
    pub reason: Cow<'a, str>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonTruncation {
    pub offset: u64,
    pub records_loaded: u64,
}

impl<'a> JsonReport<'a> {
    pub fn new(report: &'a Report<'a>) -> Self {
        let (a, load) = (report.analysis, report.load);
        let meta = a.meta.as_ref();
        let mut threads: Vec<JsonThread<'a>> = a
            .threads
            .values()
            .map(|t| JsonThread {
                tid: t.tid,
                pid: t.pid,
                comm: Cow::Borrowed(&t.comm),
                on_cpu_ns: t.counters.on_cpu_ns,
                runqueue_ns: t.counters.runqueue_ns,
                io_wait_ns: t.counters.io_wait_ns,
                blocked_ns: t.counters.blocked_ns,
                lifetime_ns: t.counters.lifetime_ns(),
                page_cache_misses: t.counters.page_cache_misses,
                page_cache_miss_bytes: t.counters.page_cache_miss_bytes,
                read_bytes: t.block_io.read_bytes,
                write_bytes: t.block_io.write_bytes,
                exited: t.exited,
                block_io: JsonBlockIo {
                    count: t.block_io.count,
                    p50_ns: t.block_io.p50_ns,
                    p99_ns: t.block_io.p99_ns,
                    max_ns: t.block_io.max_ns,
                },
                blocked_on: t
                    .blocked_on
                    .iter()
                    .map(|b| JsonBlockedOn {
                        kind: b.kind.to_owned(),
                        call: b.call.clone(),
                        detail: b.detail.clone(),
                        ns: b.ns,
                        wakers: b
                            .wakers
                            .iter()
                            .map(|w| JsonWaker {
                                kind: w.kind.to_owned(),
                                who: w.who.clone(),
                                tid: w.tid,
                                pid: w.pid,
                                ns: w.ns,
                            })
                            .collect(),
                    })
                    .collect(),
            })
            .collect();
        threads.sort_by_key(|t| (t.pid, t.tid));
        let processes = a
            .processes
            .values()
            .map(|p| JsonProcess {
                pid: p.pid,
                ppid: p.ppid,
                comm: Cow::Borrowed(&p.comm),
                cmdline: Cow::Borrowed(&p.cmdline),
                threads: Cow::Borrowed(&p.threads),
            })
            .collect();
        let page_cache_files = a
            .top_page_cache_files(usize::MAX)
            .into_iter()
            .map(|f| JsonFile {
                name: f.display_name(),
                path: f.path,
                dev: f.dev,
                ino: f.ino,
                pages: f.pages,
                bytes: f.bytes,
            })
            .collect();
        Self {
            version: JSON_VERSION,
            target: JsonTarget {
                pid: a.target_pids().first().copied(),
                pids: Cow::Borrowed(a.target_pids()),
                command: Cow::Borrowed(meta.map_or(&[], |m| &m.command)),
            },
            duration_ns: a.duration_ns,
            start_ns: a.start_ns,
            start_unix_ns: meta.map(|m| m.start_unix_ns),
            ended: a.ended,
            end_reason: a.end_reason.map(|r| Cow::Borrowed(EndReason::name(r))),
            hostname: meta.map(|m| Cow::Borrowed(m.hostname.as_str())),
            kernel: meta.map(|m| Cow::Borrowed(m.kernel.as_str())),
            sample_hz: meta.map(|m| m.sample_hz),
            tick_ns: meta.map(|m| m.tick_ns),
            stallscope_version: meta.map(|m| Cow::Borrowed(m.stallscope_version.as_str())),
            lost_events: a.lost_events,
            attempted_events: a.attempted_events,
            unwinding: a.unwinding.as_ref().map(Cow::Borrowed),
            python: a.python.as_ref().map(Cow::Borrowed),
            events: Cow::Borrowed(&a.events),
            threads,
            processes,
            page_cache_files,
            unavailable: a
                .unavailable
                .iter()
                .map(|u| JsonUnavailable {
                    signal: Cow::Borrowed(&u.signal),
                    reason: Cow::Borrowed(&u.reason),
                })
                .collect(),
            truncated: load.truncated.map(|t| JsonTruncation {
                offset: t.offset,
                records_loaded: t.records_loaded,
            }),
            unknown_records: load.unknown_records,
            records: load.records,
            gpus: gpu::json_gpus(a, report.attribution),
            cuda_processes: Cow::Borrowed(&a.cuda_processes),
            cuda: Cow::Borrowed(&report.cuda),
            ranks: Cow::Borrowed(&report.ranks),
            stalls: gpu::json_stalls(report.attribution),
            verdict: gpu::json_verdict(report.attribution),
            unchecked_causes: Cow::Borrowed(report.attribution.map_or(&[], |a| &a.unchecked)),
            advice: Cow::Borrowed(report.attribution.map_or(&[], |a| &a.advice)),
        }
    }
}
