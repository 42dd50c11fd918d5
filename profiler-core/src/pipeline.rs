//! Recordings in, a job's report out: the one route from recording files to every output.
//!
//! [`load`] folds a file; [`analyze_job`] tells waiting from work over every GPU of the job
//! (see [`crate::attribution::waiting`]), then labels each recording's GPU idle time, keeping
//! what the outputs asked for ([`Keep`]: the timeline's events, each cause's stacks) and
//! freeing the timed samples. `record`, `report`, `diff`, `check`, the agent (through
//! `record --segment`) and the tests all take this route; each output renders from the
//! [`Analyzed`] recordings it returns.
use std::io::Read;

use crate::analysis::fold::{Folded, load_reader};
use crate::analysis::model::Analysis;
use crate::attribution::{
    Attribution, Cause, attribute_with,
    waiting::{Calibration, calibration},
};
use crate::recording::format::FormatError;
use crate::recording::reader::LoadInfo;
use crate::report::cause_stacks::{CauseStacks, cause_stacks};
use crate::report::model::{JobReport, Report};
use crate::timeline::{self, RecordingLanes, TimelineEvents};

/// A recording folded, not yet attributed.
#[derive(Debug)]
pub struct Loaded {
    /// How the outputs name it (its file's name, or its path as given).
    pub name: String,
    pub folded: Folded,
    pub load: LoadInfo,
}

/// Folds the recording `r`, named `name` in the outputs, as a stream.
pub fn load<R: Read + Send>(name: impl Into<String>, r: R) -> Result<Loaded, FormatError> {
    let (folded, load) = load_reader(r)?;
    Ok(Loaded {
        name: name.into(),
        folded,
        load,
    })
}

/// What the outputs need of the timed samples, which are freed once the attribution is made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Keep {
    /// The timeline's events (the Perfetto and HTML timelines).
    pub timeline: bool,
    /// Each cause's stacks (its flame graph).
    pub cause_stacks: bool,
}

/// One recording folded and attributed: what every output renders from.
#[derive(Debug)]
pub struct Analyzed {
    pub name: String,
    pub analysis: Analysis,
    /// `None` when the recording has no GPU samples.
    pub attribution: Option<Attribution>,
    pub load: LoadInfo,
    /// Kept when [`Keep::timeline`] asked; [`Analyzed::lanes`] takes them.
    pub events: Option<TimelineEvents>,
    /// Each cause's stacks in [`Cause::ALL`]'s order, when [`Keep::cause_stacks`] asked.
    pub causes: Vec<CauseStacks>,
}

impl Analyzed {
    pub fn report(&self) -> Report<'_> {
        Report::new(&self.analysis, self.attribution.as_ref(), &self.load)
    }

    /// The timeline lanes from `events` (see [`Analyzed::events`]).
    pub fn lanes(&self, events: TimelineEvents) -> RecordingLanes<'_> {
        timeline::build(
            &self.name,
            &self.analysis,
            self.attribution.as_ref(),
            events,
        )
    }
}

/// The job's report over its recordings, in their order.
pub fn job_report(recordings: &[Analyzed]) -> JobReport<'_> {
    JobReport::new(
        recordings
            .iter()
            .map(|r| (r.name.clone(), r.report()))
            .collect(),
    )
}

/// How waiting is told from work, over every GPU of these recordings: a host whose GPUs all
/// waited is judged against the straggler's.
pub fn calibrate(recordings: &[&Loaded]) -> Calibration {
    let analyses: Vec<&Analysis> = recordings.iter().map(|l| &l.folded.analysis).collect();
    calibration(&analyses)
}

/// Attributes one recording under the job's `calibration`, keeping what `keep` asks. Meanwhile
/// `alongside` runs on a thread of its own with the model, which the attribution does not
/// change (an output's work that needs no attribution). Without [`Keep::timeline`], the tick
/// slices are dropped once attributed.
pub fn attribute<R: Send>(
    loaded: Loaded,
    calibration: &Calibration,
    keep: Keep,
    alongside: impl FnOnce(&Analysis) -> R + Send,
) -> (Analyzed, R) {
    let Loaded { name, folded, load } = loaded;
    let Folded {
        mut analysis,
        timed,
    } = folded;
    let tick = analysis.meta.as_ref().map_or(0, |m| m.tick_ns);
    let (attribution, causes, events, beside) = std::thread::scope(|scope| {
        let beside = scope.spawn(|| alongside(&analysis));
        let attribution = attribute_with(&analysis, &timed, calibration);
        let causes: Vec<CauseStacks> = if keep.cause_stacks {
            Cause::ALL
                .iter()
                .map(|&cause| cause_stacks(&timed, attribution.as_ref(), cause))
                .collect()
        } else {
            Vec::new()
        };
        // The timed samples are the bulk of a long recording's memory: the timeline keeps
        // its CPU samples as they are stored, and what comes after reuses the rest.
        let events = keep.timeline.then(|| TimelineEvents::keep(timed, tick));
        let beside = beside
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        (attribution, causes, events, beside)
    });
    // The tick slices (tens of megabytes for an hour) serve the attribution and the timeline
    // lanes; without the lanes, what comes after (the flame graphs) reuses their memory.
    if !keep.timeline {
        analysis.timeline = Vec::new();
    }
    (
        Analyzed {
            name,
            analysis,
            attribution,
            load,
            events,
            causes,
        },
        beside,
    )
}

/// One recording alone: waiting is judged by its own GPUs.
pub fn analyze(loaded: Loaded, keep: Keep) -> Analyzed {
    let calibration = calibrate(&[&loaded]);
    attribute(loaded, &calibration, keep, |_| ()).0
}

/// Every recording of one job (one per host), under one calibration over all their GPUs.
pub fn analyze_job(recordings: Vec<Loaded>, keep: Keep) -> Vec<Analyzed> {
    let calibration = calibrate(&recordings.iter().collect::<Vec<_>>());
    recordings
        .into_iter()
        .map(|l| attribute(l, &calibration, keep, |_| ()).0)
        .collect()
}

impl Folded {
    /// This recording alone, attributed, with its timeline (its tick slices and events) but
    /// no cause's stacks.
    pub fn analyzed(self, load: LoadInfo) -> Analyzed {
        analyze(
            Loaded {
                name: String::new(),
                folded: self,
                load,
            },
            Keep {
                timeline: true,
                cause_stacks: false,
            },
        )
    }
}
