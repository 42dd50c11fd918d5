//! NVML's samples, made into records: rebasing its timestamps onto CLOCK_MONOTONIC, and
//! turning its utilization samples (and the gaps between them) into idle time; and the one
//! table of its clock-event reasons.
pub mod clock;
pub mod clock_events;
pub mod samples;
