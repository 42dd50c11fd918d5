//! What /proc says about the traced processes: their tree, threads, names, environment and
//! open files; and the host's CPU time and copy rate.
pub mod blocked_in;
pub mod files;
pub mod host_copy;
pub mod host_cpu;
pub mod target;
