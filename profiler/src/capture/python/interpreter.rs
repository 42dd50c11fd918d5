//! Finding the CPython interpreter a process runs, and its threads' states, in its memory.
//!
//! The interpreter's root is the `_PyRuntime` global, exported by `libpython3.X.so` or by
//! a statically linked `python3.X`; the version comes from that file's name, and with it the
//! layout of every structure read from there on.
use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
};

use object::{Object, ObjectSegment, ObjectSymbol};

use super::{
    layout::{Layout, layout},
    memory::Memory,
};

/// A CPython interpreter found in a process.
#[derive(Clone, Debug)]
pub struct Interpreter {
    pub layout: &'static Layout,
    /// Where `_PyRuntime` lies in the process.
    pub runtime: u64,
    /// Where `PyCode_Type` lies: a frame's code object is checked to be one.
    pub code_type: Option<u64>,
    /// The file it was found in, for warnings.
    pub path: PathBuf,
    /// Before 3.11 a thread state names its thread by `pthread_t` only: the offset of the
    /// kernel TID inside glibc's `struct pthread`, once found.
    pthread_tid: Option<u64>,
}

/// What a process's mappings say of Python.
#[derive(Debug)]
pub enum Found {
    NotPython,
    /// CPython of a version this build has no layout for.
    Unsupported {
        version: (u8, u8),
        path: PathBuf,
    },
    Python(Interpreter),
}

/// `(major, minor)` from a file name such as `python3.11`, `libpython3.12.so.1.0`,
/// `python3.13t`.
pub fn version_of(file_name: &str) -> Option<(u8, u8)> {
    let rest = file_name
        .strip_prefix("libpython")
        .or_else(|| file_name.strip_prefix("python"))?;
    let (major, rest) = rest.split_once('.')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let after = &rest[digits.len()..];
    // `python3.11-config` and the like are no interpreters.
    if !(after.is_empty() || after.starts_with(".so") || after == "d" || after == "t") {
        return None;
    }
    Some((major.parse().ok()?, digits.parse().ok()?))
}

/// A file mapping of `/proc/PID/maps`: start address, file offset, path.
fn file_mappings(maps: &str) -> Vec<(u64, u64, PathBuf)> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let _dev = f.next()?;
            let _inode = f.next()?;
            let path = f.next()?;
            if !path.starts_with('/') {
                return None;
            }
            let start = u64::from_str_radix(range.split_once('-')?.0, 16).ok()?;
            Some((start, offset, PathBuf::from(path)))
        })
        .collect()
}

/// The runtime addresses of `names` in the ELF file `path` of process `pid`, mapped at
/// `start` from file offset `offset`.
fn symbols(
    pid: u32,
    path: &Path,
    start: u64,
    offset: u64,
    names: &[&str],
) -> Result<Vec<Option<u64>>, String> {
    let on_disk =
        Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path));
    let data = std::fs::read(&on_disk).map_err(|e| format!("{}: {e}", path.display()))?;
    let elf = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    // The bias from the loadable segment the mapping begins in.
    let (vaddr, file_off) = elf
        .segments()
        .filter_map(|s| {
            let (o, n) = s.file_range();
            (o <= offset && offset < o + n.max(1)).then_some((s.address(), o))
        })
        .next()
        .ok_or_else(|| format!("{}: no segment holds offset {offset:#x}", path.display()))?;
    let bias = (start + file_off).wrapping_sub(offset + vaddr);
    let mut found: HashMap<&str, u64> = HashMap::new();
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        if sym.is_undefined() {
            continue;
        }
        if let Ok(name) = sym.name()
            && let Some(&want) = names.iter().find(|n| **n == name)
        {
            found
                .entry(want)
                .or_insert(sym.address().wrapping_add(bias));
        }
    }
    Ok(names.iter().map(|n| found.get(n).copied()).collect())
}

impl Interpreter {
    /// Finds the interpreter of `pid` from its maps' text.
    pub fn find(pid: u32, maps: &str) -> Result<Found, String> {
        let mut candidates: Vec<(u64, u64, PathBuf, (u8, u8))> = file_mappings(maps)
            .into_iter()
            .filter_map(|(start, offset, path)| {
                let version = version_of(path.file_name()?.to_str()?)?;
                Some((start, offset, path, version))
            })
            .collect();
        // The library holds the runtime when there is one; each file by its lowest mapping.
        candidates.sort_by_key(|(start, offset, path, _)| {
            let lib = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("lib"));
            (!lib, path.clone(), *offset, *start)
        });
        candidates.dedup_by(|a, b| a.2 == b.2);
        let mut last_error = None;
        for (start, offset, path, version) in candidates {
            let Some(layout) = layout(version.0, version.1) else {
                return Ok(Found::Unsupported { version, path });
            };
            match symbols(pid, &path, start, offset, &["_PyRuntime", "PyCode_Type"]) {
                Ok(addrs) => {
                    if let Some(runtime) = addrs[0] {
                        return Ok(Found::Python(Interpreter {
                            layout,
                            runtime,
                            code_type: addrs[1],
                            path,
                            pthread_tid: None,
                        }));
                    }
                }
                Err(e) => last_error = Some(e),
            }
        }
        match last_error {
            Some(e) => Err(e),
            None => Ok(Found::NotPython),
        }
    }

    /// Every thread state of every interpreter of the process, by kernel TID. `tids` are the
    /// process's threads now (from `/proc/PID/task`), to find and check the TIDs of versions
    /// that only keep a `pthread_t`.
    pub fn threads(
        &mut self,
        mem: &Memory,
        tids: &HashSet<u32>,
    ) -> Result<Vec<(u32, u64)>, String> {
        let l = self.layout;
        let mut states = Vec::new();
        let mut interp = mem
            .u64(self.runtime + l.runtime_interpreters_head)
            .ok_or("the interpreter list cannot be read")?;
        let mut interps = 0;
        while interp != 0 && interps < 64 {
            interps += 1;
            let mut tstate = mem.u64(interp + l.interp_threads_head).unwrap_or(0);
            let mut n = 0;
            while tstate != 0 && n < 65536 {
                n += 1;
                let ident = mem
                    .u64(tstate + l.tstate_thread_id)
                    .ok_or("a thread state cannot be read")?;
                let native = match l.tstate_native_thread_id {
                    Some(off) => mem.u64(tstate + off).map(|t| t as u32),
                    None => None,
                };
                states.push((tstate, ident, native));
                tstate = mem.u64(tstate + l.tstate_next).unwrap_or(0);
            }
            interp = mem.u64(interp + l.interp_next).unwrap_or(0);
        }
        if l.tstate_native_thread_id.is_some() {
            return Ok(states
                .into_iter()
                .filter_map(|(t, _, native)| Some((native?, t)))
                .filter(|(tid, _)| tids.contains(tid))
                .collect());
        }
        let idents: Vec<u64> = states.iter().map(|s| s.1).collect();
        if self.pthread_tid.is_none() {
            self.pthread_tid = pthread_tid_offset(mem, &idents, tids);
        }
        let off = self
            .pthread_tid
            .ok_or("no thread's kernel TID was found in its pthread")?;
        Ok(states
            .into_iter()
            .filter_map(|(t, ident, _)| Some((mem.i32(ident + off)? as u32, t)))
            .filter(|(tid, _)| tids.contains(tid))
            .collect())
    }
}

/// glibc's offset of `tid` in `struct pthread` on x86_64 for many releases.
const GLIBC_PTHREAD_TID: u64 = 0x2d0;

/// The offset in `struct pthread` (a `pthread_t` points at it) that holds the kernel TID: the
/// one at which every thread's pthread holds one of the process's TIDs, each a different
/// one. glibc's own offset wins a tie.
pub fn pthread_tid_offset(mem: &Memory, idents: &[u64], tids: &HashSet<u32>) -> Option<u64> {
    const SCAN: usize = 2048;
    let blocks: Vec<Vec<u8>> = idents.iter().filter_map(|&p| mem.bytes(p, SCAN)).collect();
    if blocks.is_empty() {
        return None;
    }
    let fits = |off: usize| {
        let mut seen = HashSet::new();
        blocks.iter().all(|b| {
            let tid = u32::from_le_bytes(b[off..off + 4].try_into().unwrap_or_default());
            tids.contains(&tid) && seen.insert(tid)
        })
    };
    if fits(GLIBC_PTHREAD_TID as usize) {
        return Some(GLIBC_PTHREAD_TID);
    }
    (0..SCAN - 4)
        .step_by(4)
        .find(|&o| fits(o))
        .map(|o| o as u64)
}

/// The TIDs of process `pid` now.
pub fn task_tids(pid: u32) -> HashSet<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_come_from_interpreter_file_names_only() {
        assert_eq!(version_of("python3.11"), Some((3, 11)));
        assert_eq!(version_of("libpython3.12.so.1.0"), Some((3, 12)));
        assert_eq!(version_of("python3.13t"), Some((3, 13)));
        assert_eq!(version_of("libpython3.8d.so"), None);
        assert_eq!(version_of("python3.11-config"), None);
        assert_eq!(version_of("python3"), None);
        assert_eq!(version_of("pythonista"), None);
    }

    #[test]
    fn file_mappings_keep_paths_and_skip_anonymous_ones() {
        let maps = "55d0c000-55d0d000 r--p 00000000 08:01 1234 /usr/bin/python3.11\n\
                    7f00-7f10 rw-p 00000000 00:00 0 \n\
                    7f10-7f20 r-xp 00002000 08:01 99 /lib/libpython3.11.so.1.0\n\
                    7f20-7f30 r--p 00000000 00:00 0 [vdso]\n";
        let m = file_mappings(maps);
        assert_eq!(m.len(), 2);
        assert_eq!(
            m[1],
            (0x7f10, 0x2000, PathBuf::from("/lib/libpython3.11.so.1.0"))
        );
    }
}
