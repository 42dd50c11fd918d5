//! `record --segment`: the recording as back-to-back files `NAME.1.rec`, `NAME.2.rec`, ...,
//! each a complete recording of its own stretch (see `profiler_core::recording::segments`),
//! while the programs and probes stay attached.
use std::path::{Path, PathBuf};

use profiler_core::recording::{record::Record, segments::Segments};

use super::{recording_file::RecordingFile, sink::Sink};

/// The file of segment `number` of a recording named `output`: `run.rec` gives `run.3.rec`.
pub fn segment_path(output: &Path, number: u32) -> PathBuf {
    let stem = output
        .file_stem()
        .map_or_else(|| "stallscope".into(), |s| s.to_string_lossy().into_owned());
    let ext = output
        .extension()
        .map_or_else(|| "rec".into(), |e| e.to_string_lossy().into_owned());
    output.with_file_name(format!("{stem}.{number}.{ext}"))
}

pub struct SegmentFiles {
    segments: Segments,
    file: RecordingFile,
    output: PathBuf,
    number: u32,
}

impl SegmentFiles {
    /// Creates the first segment's file.
    pub fn create(output: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            segments: Segments::new(),
            file: RecordingFile::create(&segment_path(output, 1))?,
            output: output.to_path_buf(),
            number: 1,
        })
    }

    fn current(&self) -> PathBuf {
        segment_path(&self.output, self.number)
    }
}

impl Sink for SegmentFiles {
    fn write(&mut self, record: &Record) -> anyhow::Result<()> {
        if let Some(r) = self.segments.pass(record) {
            self.file.write(&r)?;
        }
        Ok(())
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        Ok(self.file.flush()?)
    }

    fn cut(&mut self, start_ns: u64, start_unix_ns: u64) -> anyhow::Result<Option<PathBuf>> {
        self.file.flush()?;
        let done = self.current();
        self.number += 1;
        // The finished file is closed when its writer drops here.
        self.file = RecordingFile::create(&self.current())?;
        for r in self.segments.begin(start_ns, start_unix_ns) {
            self.file.write(&r)?;
        }
        Ok(Some(done))
    }

    fn segment(&self) -> Option<PathBuf> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_numbered_before_the_extension() {
        assert_eq!(
            segment_path(Path::new("/tmp/run.rec"), 3),
            PathBuf::from("/tmp/run.3.rec")
        );
        assert_eq!(
            segment_path(Path::new("out"), 1),
            PathBuf::from("out.1.rec")
        );
    }
}
