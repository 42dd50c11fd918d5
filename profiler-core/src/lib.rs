//! stallscope's pure analysis core: the recording format, the model folded from it, and reports.
//!
//! Nothing here touches the OS: readers and writers are passed in, so every layer is testable
//! without root, eBPF or a GPU. The flow is [`RecordingWriter`] → file → [`load_reader`] →
//! [`Folded`] → [`attribution::attribute`] → [`report::Report`] → a [`report::Render`] format,
//! and [`report::flamegraph`].
pub mod analyze;
pub mod attribution;
pub mod clock;
pub mod cuda;
pub mod format;
mod fxhash;
pub mod model;
pub mod percentiles;
pub mod reader;
pub mod record;
pub mod report;
pub mod samples;
mod table;
pub mod timed;
pub mod timeline;
mod units;

pub use analyze::{Analyzed, Analyzer, Folded, LoadInfo, analyze, load_reader};
pub use format::{FormatError, RecordingWriter, Truncation};
pub use model::Analysis;
pub use reader::{RecordReader, Recording, read_recording};
pub use report::{Format, JobReport, Render, Report};
