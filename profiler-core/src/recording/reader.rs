//! Reading a recording back: a streaming [`RecordReader`] and the all-at-once [`read_recording`].
//!
//! Damage at the very end of a file (a profiler killed mid-write) is not an error: everything
//! before it loads and the damage is reported as a [`Truncation`]. Damage followed by more data
//! is [`FormatError::Corrupt`]. A frame whose crc matches but whose payload does not decode is a
//! record variant from a newer writer: it is counted and skipped.
use std::io::{self, BufRead, BufReader, Read};

use crate::recording::format::{
    FORMAT_VERSION, FRAME_HEADER_LEN, FormatError, HEADER_LEN, MAGIC, MAX_PAYLOAD_BYTES, Truncation,
};
use crate::recording::record::Record;

/// Payloads up to this size are read into a pre-sized buffer; larger declared sizes grow the
/// buffer as bytes actually arrive, so a damaged length at the end of a short file costs nothing.
const PRESIZE_LIMIT_BYTES: usize = 64 * 1024;
const READ_BUFFER_BYTES: usize = 256 * 1024;

/// How loading a recording went, alongside what was folded from it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoadInfo {
    /// Set when the file ends in a cut-short or damaged frame.
    pub truncated: Option<Truncation>,
    /// Records of a kind newer than this version, skipped.
    pub unknown_records: u64,
    /// Records analysed.
    pub records: u64,
}

/// A whole recording in memory. Prefer [`RecordReader`] for large files.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Recording {
    pub records: Vec<Record>,
    pub truncated: Option<Truncation>,
    /// Frames with a valid crc whose record kind this version does not know.
    pub unknown_records: u64,
}

/// Reads every record of a recording into memory.
pub fn read_recording<R: Read>(r: R) -> Result<Recording, FormatError> {
    let mut reader = RecordReader::new(r)?;
    let mut records = Vec::new();
    while let Some(record) = reader.next_record()? {
        records.push(record);
    }
    Ok(Recording {
        records,
        truncated: reader.truncation(),
        unknown_records: reader.unknown_records(),
    })
}

/// Streams records out of a recording without holding more than one in memory.
///
/// After [`Self::next_record`] returns `Ok(None)`, [`Self::truncation`] says whether the file
/// ended cleanly. The reader buffers internally, so pass it an unbuffered source.
pub struct RecordReader<R: Read> {
    inner: BufReader<R>,
    /// Bytes consumed from the start of the file.
    offset: u64,
    records: u64,
    unknown_records: u64,
    truncated: Option<Truncation>,
    done: bool,
    payload: Vec<u8>,
}

impl<R: Read> RecordReader<R> {
    /// Reads and checks the file header. A file that stops inside the header (including an
    /// empty one) reads as a truncated recording with no records.
    pub fn new(r: R) -> Result<Self, FormatError> {
        let mut reader = Self {
            inner: BufReader::with_capacity(READ_BUFFER_BYTES, r),
            offset: 0,
            records: 0,
            unknown_records: 0,
            truncated: None,
            done: false,
            payload: Vec::new(),
        };
        let mut header = [0u8; HEADER_LEN];
        let n = read_full(&mut reader.inner, &mut header)?;
        let magic_len = n.min(MAGIC.len());
        if header[..magic_len] != MAGIC[..magic_len] {
            return Err(FormatError::NotARecording);
        }
        if n < HEADER_LEN {
            reader.truncate(0);
            return Ok(reader);
        }
        let found = u16::from_le_bytes([header[8], header[9]]);
        if found == 0 || found > FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                found,
                supported: FORMAT_VERSION,
            });
        }
        reader.offset = HEADER_LEN as u64;
        Ok(reader)
    }

    /// The next record, `Ok(None)` at the end of the file or at a truncation. After an error
    /// the reader is finished and returns `Ok(None)`.
    #[inline]
    pub fn next_record(&mut self) -> Result<Option<Record>, FormatError> {
        let next = self.decode_next();
        if next.is_err() {
            self.done = true;
        }
        next
    }

    #[inline]
    fn decode_next(&mut self) -> Result<Option<Record>, FormatError> {
        loop {
            if self.done {
                return Ok(None);
            }
            match self.buffered_frame() {
                Buffered::Record(record) => {
                    self.records += 1;
                    return Ok(Some(record));
                }
                Buffered::Unknown => {
                    self.unknown_records += 1;
                    continue;
                }
                Buffered::NotThere => {}
            }
            let frame_offset = self.offset;
            let Some(payload_len) = self.read_frame(frame_offset)? else {
                return Ok(None);
            };
            match postcard::from_bytes::<Record>(&self.payload[..payload_len]) {
                Ok(record) => {
                    self.records += 1;
                    return Ok(Some(record));
                }
                // The crc matched, so the bytes are what the writer wrote: a newer record kind.
                Err(_) => self.unknown_records += 1,
            }
        }
    }

    /// Decodes the next frame in place when the read buffer holds all of it and its crc
    /// matches: most frames, with no copy. Anything else takes the careful path.
    #[inline]
    fn buffered_frame(&mut self) -> Buffered {
        let buf = self.inner.buffer();
        let Some(header) = buf.get(..FRAME_HEADER_LEN) else {
            return Buffered::NotThere;
        };
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let Some(end) = FRAME_HEADER_LEN.checked_add(len) else {
            return Buffered::NotThere;
        };
        let Some(payload) = buf.get(FRAME_HEADER_LEN..end) else {
            return Buffered::NotThere;
        };
        if crc32fast::hash(payload) != crc {
            return Buffered::NotThere;
        }
        let decoded = postcard::from_bytes::<Record>(payload);
        self.inner.consume(end);
        self.offset += end as u64;
        match decoded {
            Ok(record) => Buffered::Record(record),
            // The crc matched, so the bytes are what the writer wrote: a newer record kind.
            Err(_) => Buffered::Unknown,
        }
    }

    /// Reads one frame into `self.payload` and checks its crc. `Ok(None)` at a clean end or a
    /// truncation (which it records).
    fn read_frame(&mut self, frame_offset: u64) -> Result<Option<usize>, FormatError> {
        let mut header = [0u8; FRAME_HEADER_LEN];
        let n = read_full(&mut self.inner, &mut header)?;
        if n == 0 {
            self.done = true;
            return Ok(None);
        }
        if n < FRAME_HEADER_LEN {
            self.truncate(frame_offset);
            return Ok(None);
        }
        self.offset += FRAME_HEADER_LEN as u64;
        let declared = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let len = declared as usize;

        if len > MAX_PAYLOAD_BYTES {
            // Skip without storing, only to learn whether the file even has that many bytes.
            let available = io::copy(
                &mut (&mut self.inner).take(declared.into()),
                &mut io::sink(),
            )?;
            if available < u64::from(declared) {
                self.truncate(frame_offset);
                return Ok(None);
            }
            return Err(FormatError::Corrupt {
                offset: frame_offset,
                reason: format!(
                    "frame declares a {declared} byte payload, over the {MAX_PAYLOAD_BYTES} byte cap"
                ),
            });
        }

        let got = self.read_payload(len)?;
        self.offset += got as u64;
        if got < len {
            self.truncate(frame_offset);
            return Ok(None);
        }
        if crc32fast::hash(&self.payload[..len]) != crc {
            if self.at_eof()? {
                self.truncate(frame_offset);
                return Ok(None);
            }
            return Err(FormatError::Corrupt {
                offset: frame_offset,
                reason: "payload crc mismatch".to_owned(),
            });
        }
        Ok(Some(len))
    }

    /// Reads up to `len` bytes into `self.payload`, returning how many arrived.
    fn read_payload(&mut self, len: usize) -> io::Result<usize> {
        if len <= PRESIZE_LIMIT_BYTES {
            if self.payload.len() < len {
                self.payload.resize(len, 0);
            }
            read_full(&mut self.inner, &mut self.payload[..len])
        } else {
            self.payload.clear();
            (&mut self.inner)
                .take(len as u64)
                .read_to_end(&mut self.payload)
        }
    }

    fn at_eof(&mut self) -> io::Result<bool> {
        loop {
            match self.inner.fill_buf() {
                Ok(buf) => return Ok(buf.is_empty()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    fn truncate(&mut self, offset: u64) {
        self.done = true;
        self.truncated = Some(Truncation {
            offset,
            records_loaded: self.records,
        });
    }

    /// Set once reading stopped at a cut-short or damaged final frame.
    pub fn truncation(&self) -> Option<Truncation> {
        self.truncated
    }

    /// Frames skipped because their record kind is newer than this reader.
    pub fn unknown_records(&self) -> u64 {
        self.unknown_records
    }

    /// Records decoded so far.
    pub fn records_read(&self) -> u64 {
        self.records
    }

    /// Bytes consumed so far.
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl<R: Read> Iterator for RecordReader<R> {
    type Item = Result<Record, FormatError>;

    /// Yields records until the end; an error is yielded once and ends the iteration.
    fn next(&mut self) -> Option<Self::Item> {
        match self.next_record() {
            Ok(Some(record)) => Some(Ok(record)),
            Ok(None) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

enum Buffered {
    Record(Record),
    Unknown,
    /// Not wholly in the buffer, or damaged: left for the careful path.
    NotThere,
}

/// Fills `buf` as far as the source allows; returns the bytes read (less than `buf.len()` only
/// at end of file).
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}
