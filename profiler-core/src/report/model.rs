//! The report model: one recording's [`Report`], a job's [`JobReport`], and the [`Render`]
//! trait every format implements, with the [`Files`] a format of several files writes into.
use std::io::{self, Write};

use crate::analysis::model::Analysis;
use crate::attribution::{Attribution, ranks::RankView};
use crate::cuda::CudaSummary;
use crate::recording::reader::LoadInfo;
use crate::timeline::RecordingLanes;

use super::cause_stacks::CauseStacks;

/// A flame graph to embed in a page: its name (`oncpu`, `cause-disk`, ...) and SVG.
#[derive(Clone, Debug)]
pub struct Flamegraph {
    pub name: String,
    pub svg: String,
}

/// One recording's report: everything a format reads.
#[derive(Debug)]
pub struct Report<'a> {
    pub analysis: &'a Analysis,
    pub load: &'a LoadInfo,
    /// `None` when the recording has no GPU samples.
    pub attribution: Option<&'a Attribution>,
    pub ranks: RankView,
    pub cuda: CudaSummary<'a>,
}

impl<'a> Report<'a> {
    pub fn new(
        analysis: &'a Analysis,
        attribution: Option<&'a Attribution>,
        load: &'a LoadInfo,
    ) -> Self {
        Report {
            analysis,
            load,
            attribution,
            ranks: crate::attribution::ranks::ranks(&[(analysis, attribution)]),
            cuda: crate::cuda::summarize(&analysis.cuda),
        }
    }
}

/// Several recordings of one job (one per host): each one's report, and the ranks across all
/// of them.
#[derive(Debug)]
pub struct JobReport<'a> {
    /// Each recording's file name with its report.
    pub recordings: Vec<(String, Report<'a>)>,
    pub ranks: RankView,
    /// What can and cannot be compared across the hosts' clocks.
    pub clock_note: String,
}

impl<'a> JobReport<'a> {
    pub fn new(recordings: Vec<(String, Report<'a>)>) -> Self {
        let each: Vec<(&Analysis, Option<&Attribution>)> = recordings
            .iter()
            .map(|(_, r)| (r.analysis, r.attribution))
            .collect();
        let analyses: Vec<&Analysis> = each.iter().map(|(a, _)| *a).collect();
        JobReport {
            ranks: crate::attribution::ranks::ranks(&each),
            clock_note: clock_note(&analyses),
            recordings,
        }
    }
}

/// What a report is about: one recording, or a job's several.
#[derive(Clone, Copy)]
pub enum Subject<'r, 'a> {
    One(&'r Report<'a>),
    Job(&'r JobReport<'a>),
}

impl Subject<'_, '_> {
    /// What can and cannot be compared across the hosts' clocks, for a job.
    pub fn clock_note(&self) -> Option<&str> {
        match self {
            Subject::Job(j) => Some(&j.clock_note),
            Subject::One(_) => None,
        }
    }
}

/// Everything a format renders from: the report; for the timeline formats each recording's
/// lanes and the flame graphs to embed; for the flame graphs, each cause's stacks (all empty
/// when not kept).
#[derive(Clone, Copy)]
pub struct Inputs<'r, 'a> {
    pub subject: Subject<'r, 'a>,
    pub lanes: &'r [RecordingLanes<'r>],
    pub graphs: &'r [Flamegraph],
    /// One recording's stacks of each cause (see [`crate::pipeline::Keep::cause_stacks`]).
    pub cause_stacks: &'r [CauseStacks],
    /// Whether an HTML page will embed what a drawing format draws (it is asked for too).
    pub for_page: bool,
}

impl<'r, 'a> Inputs<'r, 'a> {
    /// A report alone, without timeline or graphs.
    pub fn report(subject: Subject<'r, 'a>) -> Self {
        Inputs {
            subject,
            lanes: &[],
            graphs: &[],
            cause_stacks: &[],
            for_page: false,
        }
    }
}

/// Where a format of several files ([`super::Destination::Files`]) puts them: the caller makes
/// each file (its directory, its owner), so no format touches the OS.
pub trait Files: Sync {
    /// A new file named `name` after the recording's stem (`oncpu.svg` for `run.oncpu.svg`).
    /// Its errors name the file.
    fn create(&self, name: &str) -> io::Result<Box<dyn Write + Send + '_>>;
}

/// One output format (see [`super::Format`], which picks one by name).
pub trait Render: Sync {
    /// The format as one stream: stdout, or its one file.
    fn render(&self, input: &Inputs<'_, '_>, w: &mut dyn Write) -> io::Result<()>;

    /// The format as files made by `files`: by default its one stream, named `extension`. A
    /// format of several files names each itself, and returns what it drew for an HTML page
    /// when [`Inputs::for_page`] asks.
    fn render_files(
        &self,
        input: &Inputs<'_, '_>,
        files: &dyn Files,
        extension: &str,
    ) -> io::Result<Vec<Flamegraph>> {
        let mut w = files.create(extension)?;
        self.render(input, &mut w)?;
        w.flush()?;
        Ok(Vec::new())
    }
}

/// What a combined report can and cannot compare across hosts, with the wall-clock spread of
/// the recordings' starts.
pub fn clock_note(recordings: &[&Analysis]) -> String {
    let starts: Vec<u64> = recordings
        .iter()
        .filter_map(|a| a.meta.as_ref().map(|m| m.start_unix_ns))
        .filter(|&t| t > 0)
        .collect();
    let spread = match (starts.iter().min(), starts.iter().max()) {
        (Some(lo), Some(hi)) => format!(
            "; their starts differ by {:.3} s of wall-clock time",
            (hi - lo) as f64 / 1e9
        ),
        _ => String::new(),
    };
    format!(
        "clock caveat: each host's timestamps are its own CLOCK_MONOTONIC, which other hosts \
         cannot compare; ranks are compared by their total wait in collectives, never by \
         timestamps, and wall-clock times are only as close as the hosts' clock sync (NTP: \
         milliseconds){spread}"
    )
}
