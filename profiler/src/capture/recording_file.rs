//! The recording file being written. Every record goes through here; the first write that
//! fails (a full disk) ends the writing with an error that names the file, and what was
//! written before it stays loadable: the file then ends in at most one partial frame, which
//! the reader reports as a truncation.
use std::{
    fs::File,
    io::{self, BufWriter},
    path::{Path, PathBuf},
};

use profiler_core::{RecordingWriter, record::Record};

use crate::owner;

/// A write to the recording failed; nothing more is written to it.
#[derive(Debug, thiserror::Error)]
#[error("cannot write the recording {}", path.display())]
pub struct WriteFailed {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

pub struct RecordingFile {
    /// `None` once a write has failed.
    writer: Option<RecordingWriter<BufWriter<File>>>,
    path: PathBuf,
}

impl RecordingFile {
    /// Creates the file (0600, see [`owner`]) and writes the header.
    pub fn create(path: &Path) -> anyhow::Result<Self> {
        let file = owner::create_private(path)?;
        let writer = RecordingWriter::new(BufWriter::new(file)).map_err(|source| WriteFailed {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            writer: Some(writer),
            path: path.to_path_buf(),
        })
    }

    pub fn write(&mut self, record: &Record) -> Result<(), WriteFailed> {
        let result = self.writer()?.write(record);
        self.check(result)
    }

    pub fn flush(&mut self) -> Result<(), WriteFailed> {
        let result = self.writer()?.flush();
        self.check(result)
    }

    fn writer(&mut self) -> Result<&mut RecordingWriter<BufWriter<File>>, WriteFailed> {
        self.writer.as_mut().ok_or_else(|| WriteFailed {
            path: self.path.clone(),
            source: io::Error::other("an earlier write to it failed"),
        })
    }

    fn check(&mut self, result: io::Result<()>) -> Result<(), WriteFailed> {
        let Err(source) = result else {
            return Ok(());
        };
        // Drop the buffered bytes unwritten: a later flush, once space is freed, would put
        // them after whatever part of a frame the failed write left.
        if let Some(w) = self.writer.take() {
            let (file, _unwritten) = w.into_inner().into_parts();
            drop(file);
        }
        Err(WriteFailed {
            path: self.path.clone(),
            source,
        })
    }
}
