//! Uprobes on the CUDA driver and runtime and on NCCL, found in each process's mapped
//! libraries; the kernel-launch probes are switched on for a duty cycle.
pub mod cuda;
mod elf;
pub mod launch_duty;
