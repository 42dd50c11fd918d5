//! The report model and its formats.
//!
//! A [`Report`] is built once per recording from its analysis and attribution, with what
//! several formats read (the ranks, the CUDA summary) computed once. Every format renders
//! from it through [`Render`]; several recordings of one job render as a [`JobReport`].
//! The flame graphs are a format of several files (`flamegraph::render`), drawn per recording
//! from its [`cause_stacks`] and its on- and off-CPU samples.
pub mod cause_stacks;
pub mod compact;
pub mod flamegraph;
pub mod format;
pub mod html;
pub mod json;
pub mod losses;
pub mod markdown;
pub mod model;
#[cfg(feature = "perfetto")]
pub mod perfetto;
pub mod text;

pub use format::{Destination, Format};
pub use model::{Files, Inputs, JobReport, Render, Report, Subject, clock_note};
