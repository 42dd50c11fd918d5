//! stallscope's pure analysis core: the recording format, the model folded from it, the
//! attribution of GPU idle time, and the reports.
//!
//! Nothing here touches the OS: readers and writers are passed in, so every layer is testable
//! without root, eBPF or a GPU. The flow is [`RecordingWriter`] → file → [`pipeline`]
//! ([`pipeline::load`] → [`Folded`] → [`pipeline::analyze_job`] → [`Analyzed`]) →
//! [`report::Report`] → a [`report::Render`] format, [`report::flamegraph`] and [`timeline`].
pub mod analysis;
pub mod attribution;
pub mod cuda;
pub mod doctor;
pub mod exposition;
mod fxhash;
pub mod gate;
pub mod kernel_support;
pub mod live;
pub mod nvml;
pub mod pipeline;
pub mod recording;
pub mod report;
mod table;
pub mod timeline;
mod units;

pub use analysis::fold::{Analyzer, Folded, analyze, load_reader};
pub use analysis::model::Analysis;
pub use pipeline::Analyzed;
pub use recording::format::{FormatError, RecordingWriter, Truncation};
pub use recording::reader::{LoadInfo, RecordReader, Recording, read_recording};
pub use recording::record;
pub use report::{Destination, Files, Format, Inputs, JobReport, Render, Report, Subject};
