//! Capture: the kernel programs and their maps, the CUDA/NCCL probes, what /proc says, the
//! NVML sampler, and the session that turns all of it into records handed to a [`sink::Sink`].
pub mod clock;
pub mod decode;
pub mod gpu;
pub mod handover;
pub mod kernel;
pub mod probes;
pub mod proc;
pub mod python;
pub mod reader_priority;
pub mod recording_file;
pub mod segment_files;
pub mod session;
pub mod sink;
pub mod stacks;
pub mod waker;
