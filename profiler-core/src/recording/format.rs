//! The recording file's framing: header constants, errors, and the writer.
//!
//! Layout: `b"STALLREC"`, u16 LE format version, u16 reserved, then frames of
//! `u32 LE payload length`, `u32 LE crc32(payload)`, payload = postcard-encoded [`Record`].
//! A frame is written with one `write_all`, so a profiler killed mid-write leaves at most one
//! partial frame at the end, which the reader reports as a truncation instead of failing.
use std::io::{self, Write};

use thiserror::Error;

use crate::recording::record::Record;

/// The first eight bytes of every recording.
pub const MAGIC: [u8; 8] = *b"STALLREC";
/// The format version this crate writes and the newest it reads.
pub const FORMAT_VERSION: u16 = 1;
/// Magic, version and reserved field.
pub const HEADER_LEN: usize = 12;
/// Payload length and crc32 before each payload.
pub const FRAME_HEADER_LEN: usize = 8;
/// No record comes near this; a larger declared length means a damaged file, and the cap keeps
/// a damaged length from making the reader allocate gigabytes.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;

/// Why a recording could not be read.
#[derive(Debug, Error)]
pub enum FormatError {
    #[error("not a stallscope recording (the file does not start with \"STALLREC\")")]
    NotARecording,
    #[error(
        "recording format version {found} is newer than this stallscope reads (up to {supported}); \
         use a newer stallscope"
    )]
    UnsupportedVersion { found: u16, supported: u16 },
    #[error("recording is corrupt at byte {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    #[error("reading the recording failed: {0}")]
    Io(#[from] io::Error),
}

/// Where a recording stops early: the frame at `offset` was cut short or damaged and was the
/// last thing in the file, as when the profiler is killed mid-write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Truncation {
    /// Byte offset of the first frame that could not be loaded.
    pub offset: u64,
    /// Records decoded before it.
    pub records_loaded: u64,
}

/// Writes a recording: the header on creation, then one frame per record.
///
/// Pass a buffered writer; each record is one `write_all` call.
pub struct RecordingWriter<W: Write> {
    inner: W,
    /// Reused frame buffer: frame header followed by the encoded payload.
    frame: Vec<u8>,
}

impl<W: Write> RecordingWriter<W> {
    /// Writes the file header and returns the writer.
    pub fn new(mut inner: W) -> io::Result<Self> {
        let mut header = [0u8; HEADER_LEN];
        header[..8].copy_from_slice(&MAGIC);
        header[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        inner.write_all(&header)?;
        Ok(Self {
            inner,
            frame: Vec::with_capacity(256),
        })
    }

    /// Appends one record. Fails with `InvalidInput` if it encodes to more than
    /// [`MAX_PAYLOAD_BYTES`], in which case nothing is written.
    pub fn write(&mut self, record: &Record) -> io::Result<()> {
        let mut frame = std::mem::take(&mut self.frame);
        frame.clear();
        frame.extend_from_slice(&[0u8; FRAME_HEADER_LEN]);
        let encoded = postcard::to_extend(record, frame);
        let mut frame = match encoded {
            Ok(frame) => frame,
            Err(e) => return Err(io::Error::other(format!("encoding a record failed: {e}"))),
        };
        let payload_len = frame.len() - FRAME_HEADER_LEN;
        let result = match u32::try_from(payload_len) {
            Ok(len) if payload_len <= MAX_PAYLOAD_BYTES => {
                let crc = crc32fast::hash(&frame[FRAME_HEADER_LEN..]);
                frame[..4].copy_from_slice(&len.to_le_bytes());
                frame[4..8].copy_from_slice(&crc.to_le_bytes());
                self.inner.write_all(&frame)
            }
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "record encodes to {payload_len} bytes, over the {MAX_PAYLOAD_BYTES} byte cap"
                ),
            )),
        };
        self.frame = frame;
        result
    }

    /// Flushes the underlying writer.
    pub fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }

    /// The underlying writer (not flushed: call [`Self::flush`] first if it buffers).
    pub fn into_inner(self) -> W {
        self.inner
    }

    /// The underlying writer, e.g. to look at how much has been written.
    pub fn get_ref(&self) -> &W {
        &self.inner
    }
}
