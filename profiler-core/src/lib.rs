//! stallscope's pure analysis core: the recording format, the model folded from it, and reports.
//!
//! Nothing here touches the OS: readers and writers are passed in, so every layer is testable
//! without root, eBPF or a GPU. The flow is [`RecordingWriter`] → file → [`analyze_reader`] →
//! [`Analysis`] → [`report_text`], [`report_json`] or [`folded`].
pub mod analyze;
mod flame_prune;
pub mod folded;
pub mod format;
mod fxhash;
pub mod merge;
pub mod model;
pub mod percentiles;
pub mod reader;
pub mod record;
pub mod report_gpu;
pub mod report_json;
pub mod report_text;
pub mod samples;
mod table;
pub mod timed;
pub mod timeline;
mod units;

pub use analyze::{Analyzer, LoadInfo, analyze, analyze_reader, load_reader};
pub use format::{FormatError, RecordingWriter, Truncation};
pub use model::Analysis;
pub use reader::{RecordReader, Recording, read_recording};
pub mod attribution;
pub mod clock;
pub mod cuda;
