//! The eBPF programs and their maps: loading and attaching, the kernel layout they are given
//! (BTF offsets, tracepoint fields), and the per-thread slots they account into.
pub mod bpf_call;
pub mod btf;
pub mod features;
pub mod loader;
pub mod offsets;
pub mod slots;
pub mod switch_choice;
pub mod switch_control;
pub mod switch_hooks;
pub mod tracefs;
