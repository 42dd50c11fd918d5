//! What /proc says about the traced processes: their tree, threads, names, environment and
//! open files.
pub mod files;
pub mod target;
