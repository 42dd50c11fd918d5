//! Folding a recording into the model the reports read: per thread, process, stack and
//! tick, plus the timed samples and IOs attribution draws its evidence from.
pub mod fold;
pub mod model;
pub mod off_cpu_spans;
pub mod percentiles;
pub mod stack_samples;
pub mod tick_slices;
pub mod timed_events;
pub mod wait_for;
