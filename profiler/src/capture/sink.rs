//! Where the session's records go. The recording file is one sink; a live consumer (an
//! exporter, a streaming analysis) is another, given the same records in the same order.
use profiler_core::recording::record::Record;

use super::proc::target;

/// A consumer of records, in the order they are made. An error ends the recording: the
/// session stops and reports what was written.
pub trait Sink {
    fn write(&mut self, record: &Record) -> anyhow::Result<()>;
    /// Called once per tick, after its records.
    fn flush(&mut self) -> anyhow::Result<()>;
    /// Ends the current segment, whose last record was its `End`, and starts the next at
    /// `start_ns` (`record --segment`). Returns the finished segment's file, or `None` for a
    /// sink that does not cut its records into segments.
    fn cut(
        &mut self,
        _start_ns: u64,
        _start_unix_ns: u64,
    ) -> anyhow::Result<Option<std::path::PathBuf>> {
        Ok(None)
    }
    /// The file of the segment being written, for a sink that cuts segments.
    fn segment(&self) -> Option<std::path::PathBuf> {
        None
    }
}

impl Sink for super::recording_file::RecordingFile {
    fn write(&mut self, record: &Record) -> anyhow::Result<()> {
        Ok(super::recording_file::RecordingFile::write(self, record)?)
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        Ok(super::recording_file::RecordingFile::flush(self)?)
    }
}

/// Writes a `Process` record, followed by the process's rank variables when it has any: the
/// one place a `ProcessEnv` is made, for the seeded tree and for a process seen later.
pub fn write_process(sink: &mut dyn Sink, process: &Record) -> anyhow::Result<()> {
    sink.write(process)?;
    if let Record::Process { pid, .. } = process {
        let vars = target::rank_env(*pid);
        if !vars.is_empty() {
            sink.write(&Record::ProcessEnv { pid: *pid, vars })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keeps what it is given.
    #[derive(Default)]
    struct Kept(std::rc::Rc<std::cell::RefCell<Vec<String>>>);

    impl Sink for Kept {
        fn write(&mut self, record: &Record) -> anyhow::Result<()> {
            self.0.borrow_mut().push(format!("{record:?}"));
            Ok(())
        }

        fn flush(&mut self) -> anyhow::Result<()> {
            self.0.borrow_mut().push("flush".into());
            Ok(())
        }
    }

    #[test]
    fn a_process_of_this_test_gets_no_env_record_without_rank_variables() {
        let mut kept = Kept::default();
        let seen = kept.0.clone();
        let process = Record::Process {
            ts_ns: 1,
            pid: std::process::id(),
            ppid: 1,
            cmdline: String::new(),
        };
        write_process(&mut kept, &process).unwrap();
        let has_rank = !target::rank_env(std::process::id()).is_empty();
        let seen = seen.borrow();
        assert_eq!(seen.len(), if has_rank { 2 } else { 1 }, "{seen:?}");
        assert!(seen[0].starts_with("Process"));
    }
}
