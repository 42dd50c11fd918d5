//! The regression gate: `diff` compares runs against a baseline with their noise measured,
//! `check` holds one run to absolute budgets. Both read runs as JSON reports
//! ([`input::Run::from_json`]), so a recording and a kept JSON baseline are the same input.
pub mod check;
pub mod diff;
pub mod evidence;
pub mod input;
pub mod noise;
pub mod render;
