//! The timeline's unit: a named interval with its values.
use std::borrow::Cow;

/// A value attached to a slice.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg {
    Int(i64),
    Float(f64),
    Str(String),
    /// Structured evidence, as the JSON report writes it.
    Json(serde_json::Value),
}

/// A named interval, CLOCK_MONOTONIC ns of its recording.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    pub start_ns: u64,
    pub end_ns: u64,
    pub name: Cow<'static, str>,
    pub args: Vec<(&'static str, Arg)>,
}

impl Slice {
    pub fn new(start_ns: u64, end_ns: u64, name: impl Into<Cow<'static, str>>) -> Self {
        Slice {
            start_ns,
            end_ns: end_ns.max(start_ns),
            name: name.into(),
            args: Vec::new(),
        }
    }

    pub fn arg(mut self, key: &'static str, value: Arg) -> Self {
        self.args.push((key, value));
        self
    }

    pub fn dur_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }
}
