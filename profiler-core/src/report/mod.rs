//! The report model and its formats.
//!
//! A [`Report`] is built once per recording from its analysis and attribution, with what
//! several formats read (the ranks, the CUDA summary) computed once. Every format renders
//! from it through [`Render`]; several recordings of one job render as a [`JobReport`].
//! Flame graphs are written per cause beside the report, from [`flamegraph`].
pub mod flamegraph;
pub mod html;
pub mod json;
#[cfg(feature = "perfetto")]
pub mod perfetto;
pub mod text;

use std::io::{self, Write};

use crate::analysis::fold::LoadInfo;
use crate::analysis::model::Analysis;
use crate::attribution::{Attribution, ranks::RankView};
use crate::cuda::CudaSummary;

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

/// One output format.
pub trait Render {
    fn render(&self, report: &Report<'_>, w: &mut dyn Write) -> io::Result<()>;
    fn render_job(&self, job: &JobReport<'_>, w: &mut dyn Write) -> io::Result<()>;
}

/// The formats `report` and `record` print.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    #[default]
    Text,
    Json,
}

impl Format {
    pub const ALL: [Format; 2] = [Format::Text, Format::Json];

    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Json => "json",
        }
    }

    pub fn renderer(self) -> &'static dyn Render {
        match self {
            Format::Text => &text::Text,
            Format::Json => &json::Json,
        }
    }
}

impl std::str::FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = Format::ALL.iter().map(|f| f.name()).collect();
                format!("unknown format {s:?}; one of: {}", names.join(", "))
            })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_by_name_and_refuse_others() {
        for f in Format::ALL {
            assert_eq!(f.name().parse::<Format>(), Ok(f));
        }
        let e = "yaml".parse::<Format>().unwrap_err();
        assert!(e.contains("text, json"), "{e}");
    }
}
