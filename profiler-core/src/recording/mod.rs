//! The recording: the record types, and the versioned, CRC-framed file they are written to
//! and read back from. The seam between capture and analysis.
pub mod cuda_ops;
pub mod format;
pub mod reader;
pub mod record;
pub mod segments;
