//! Code objects read from a process's memory: a Python frame's function, file and line.
use super::{layout::Layout, linetable::line_for, memory::Memory};

/// The longest name or path read; longer ones are cut there.
const MAX_STR: u64 = 4096;
/// The largest line table read.
const MAX_TABLE: u64 = 1 << 20;

/// What a frame's code object says once read: enough to name any instruction in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Code {
    /// The qualified name (3.11+: `Class.method`), else the function's name.
    pub name: String,
    pub file: String,
    pub first_line: i32,
    table: Vec<u8>,
    /// 3.11+: the address of the first instruction, inline in the code object.
    code_start: Option<u64>,
}

/// A `str` object's text: compact ASCII, Latin-1, UCS-2 and UCS-4 objects (every name and
/// path the compiler makes is compact).
pub fn read_str(mem: &Memory, l: &Layout, obj: u64) -> Option<String> {
    if obj == 0 {
        return None;
    }
    let state = mem.u8(obj + l.unicode_state)?;
    let kind = (state >> l.unicode_kind_shift) & 7;
    let compact = state & (1 << l.unicode_compact_bit) != 0;
    let ascii = state & (1 << l.unicode_ascii_bit) != 0;
    let len = mem.u64(obj + l.unicode_length)?.min(MAX_STR);
    if !compact {
        return None;
    }
    let data = obj
        + if ascii {
            l.ascii_object_size
        } else {
            l.compact_unicode_object_size
        };
    match (ascii, kind) {
        (true, 1) => String::from_utf8(mem.bytes(data, len as usize)?).ok(),
        (false, 1) => Some(
            mem.bytes(data, len as usize)?
                .iter()
                .map(|&b| b as char)
                .collect(),
        ),
        (false, 2) => {
            let b = mem.bytes(data, 2 * len as usize)?;
            let units: Vec<u16> = b
                .chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]]))
                .collect();
            Some(String::from_utf16_lossy(&units))
        }
        (false, 4) => {
            let b = mem.bytes(data, 4 * len as usize)?;
            Some(
                b.chunks_exact(4)
                    .map(|c| {
                        char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                            .unwrap_or('\u{fffd}')
                    })
                    .collect(),
            )
        }
        _ => None,
    }
}

/// A `bytes` object's contents.
fn read_bytes(mem: &Memory, l: &Layout, obj: u64) -> Option<Vec<u8>> {
    if obj == 0 {
        return None;
    }
    let len = mem.u64(obj + l.var_object_size)?;
    if len > MAX_TABLE {
        return None;
    }
    mem.bytes(obj + l.bytes_sval, len as usize)
}

impl Code {
    /// Reads the code object at `addr`; None if it is not one (`code_type`, when known, is
    /// the address of `PyCode_Type`) or cannot be read.
    pub fn read(mem: &Memory, l: &Layout, addr: u64, code_type: Option<u64>) -> Option<Code> {
        if let Some(ty) = code_type
            && mem.u64(addr + l.object_type)? != ty
        {
            return None;
        }
        let name_obj = match l.code_qualname {
            Some(off) => mem.u64(addr + off)?,
            None => mem.u64(addr + l.code_name)?,
        };
        let name = read_str(mem, l, name_obj)?;
        let file = read_str(mem, l, mem.u64(addr + l.code_filename)?)?;
        let first_line = mem.i32(addr + l.code_firstlineno)?;
        let table = read_bytes(mem, l, mem.u64(addr + l.code_linetable)?)?;
        Some(Code {
            name,
            file,
            first_line,
            table,
            code_start: l.code_code_adaptive.map(|off| addr + off),
        })
    }

    /// The line of the instruction a frame of this code was at: `instr` is the frame's
    /// `f_lasti` (before 3.11) or instruction pointer (3.11+), as the kernel read it.
    pub fn line(&self, minor: u8, instr: u64) -> Option<u32> {
        let byte_offset = match (minor, self.code_start) {
            (..=9, _) => {
                let lasti = instr as u32 as i32;
                if lasti < 0 {
                    return u32::try_from(self.first_line).ok();
                }
                lasti as u32
            }
            (10, _) => {
                let lasti = instr as u32 as i32;
                if lasti < 0 {
                    return u32::try_from(self.first_line).ok();
                }
                (lasti as u32).checked_mul(2)?
            }
            (_, Some(start)) => u32::try_from(instr.checked_sub(start)?).ok()?,
            (_, None) => return None,
        };
        line_for(minor, &self.table, self.first_line, byte_offset)
    }
}

/// A source path as a flamegraph frame shows it: from the package down for installed code
/// (`torch/utils/data/_utils/worker.py`), from the standard library's root for its modules
/// (`threading.py`), else the file's name.
pub fn short_path(path: &str) -> &str {
    for marker in ["/site-packages/", "/dist-packages/"] {
        if let Some(i) = path.rfind(marker) {
            return &path[i + marker.len()..];
        }
    }
    if let Some(i) = path.rfind("/lib/python") {
        let rest = &path[i + "/lib/python".len()..];
        if let Some(j) = rest.find('/') {
            return &rest[j + 1..];
        }
    }
    path.rsplit('/').next().unwrap_or(path)
}

/// Whether a source file belongs to an installed package, the standard library or the
/// interpreter itself rather than to the user's own code.
pub fn is_library(path: &str) -> bool {
    path.contains("/site-packages/")
        || path.contains("/dist-packages/")
        || path.contains("/lib/python3")
        || path.starts_with('<')
}

/// A Python frame's name: `function (file.py:line)`, as py-spy writes it.
pub fn frame_name(code: &Code, line: Option<u32>) -> String {
    let file = short_path(&code.file);
    match line {
        Some(line) => format!("{} ({file}:{line})", code.name),
        None => format!("{} ({file})", code.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_shorten_to_what_a_user_recognises() {
        assert_eq!(
            short_path("/venv/lib/python3.11/site-packages/torch/utils/data/_utils/worker.py"),
            "torch/utils/data/_utils/worker.py"
        );
        assert_eq!(
            short_path("/usr/lib/python3/dist-packages/numpy/core.py"),
            "numpy/core.py"
        );
        assert_eq!(
            short_path("/root/.pyenv/versions/3.11.7/lib/python3.11/threading.py"),
            "threading.py"
        );
        assert_eq!(short_path("/tmp/job/train.py"), "train.py");
        assert_eq!(
            short_path("<frozen importlib._bootstrap>"),
            "<frozen importlib._bootstrap>"
        );
    }
}
