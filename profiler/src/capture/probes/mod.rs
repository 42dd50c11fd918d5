//! Uprobes on the CUDA driver and runtime and on NCCL, found in each process's mapped
//! libraries; the kernel-launch probes are switched on for a duty cycle. And one on each
//! traced process's dynamic linker, which says when it loads a library.
pub mod cuda;
pub mod dlopen;
mod elf;
pub mod event_guard;
pub mod launch_duty;
pub mod uprobe_multi;
