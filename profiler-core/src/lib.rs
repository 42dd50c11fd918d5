//! stallscope's pure analysis core: the recording format, the model folded from it, the
//! attribution of GPU idle time, and the reports.
//!
//! Nothing here touches the OS: readers and writers are passed in, so every layer is testable
//! without root, eBPF or a GPU. The flow is [`RecordingWriter`] → file → [`load_reader`] →
//! [`Folded`] → [`attribution::attribute`] → [`report::Report`] → a [`report::Render`] format,
//! and [`report::flamegraph`].
pub mod analysis;
pub mod attribution;
pub mod cuda;
pub mod doctor;
pub mod exposition;
mod fxhash;
pub mod gate;
pub mod nvml;
pub mod recording;
pub mod report;
mod table;
pub mod timeline;
mod units;

pub use analysis::fold::{Analyzed, Analyzer, Folded, LoadInfo, analyze, load_reader};
pub use analysis::model::Analysis;
pub use recording::format::{FormatError, RecordingWriter, Truncation};
pub use recording::reader::{RecordReader, Recording, read_recording};
pub use recording::record;
pub use report::{Format, JobReport, Render, Report};
