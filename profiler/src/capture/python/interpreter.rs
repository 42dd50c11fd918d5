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

/// A file mapping of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileMapping {
    start: u64,
    offset: u64,
    /// Device and inode, as the maps list them: the file's identity across processes.
    file: (String, u64),
    path: PathBuf,
}

fn file_mappings(maps: &str) -> Vec<FileMapping> {
    maps.lines()
        .filter_map(|line| {
            let mut f = line.split_whitespace();
            let range = f.next()?;
            let _perms = f.next()?;
            let offset = u64::from_str_radix(f.next()?, 16).ok()?;
            let dev = f.next()?;
            let inode = f.next()?.parse().ok()?;
            let path = f.next()?;
            if !path.starts_with('/') {
                return None;
            }
            let start = u64::from_str_radix(range.split_once('-')?.0, 16).ok()?;
            Some(FileMapping {
                start,
                offset,
                file: (dev.to_string(), inode),
                path: PathBuf::from(path),
            })
        })
        .collect()
}

/// What is read of an interpreter's ELF file, once per file: its loadable segments
/// (address, file offset, file size) and the addresses of the symbols wanted.
#[derive(Clone, Debug)]
pub struct ElfFacts {
    segments: Vec<(u64, u64, u64)>,
    runtime: Option<u64>,
    code_type: Option<u64>,
}

/// ELF facts by file (device, inode): DataLoader workers share their parent's files, and an
/// interpreter library is tens of megabytes.
pub type ElfCache = HashMap<(String, u64), Result<ElfFacts, String>>;

fn elf_facts(pid: u32, path: &Path) -> Result<ElfFacts, String> {
    let on_disk =
        Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path));
    let data = std::fs::read(&on_disk).map_err(|e| format!("{}: {e}", path.display()))?;
    let elf = object::File::parse(&*data).map_err(|e| format!("{}: {e}", path.display()))?;
    let segments = elf
        .segments()
        .map(|s| {
            let (o, n) = s.file_range();
            (s.address(), o, n)
        })
        .collect();
    let mut facts = ElfFacts {
        segments,
        runtime: None,
        code_type: None,
    };
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        if sym.is_undefined() {
            continue;
        }
        match sym.name() {
            Ok("_PyRuntime") => facts.runtime = facts.runtime.or(Some(sym.address())),
            Ok("PyCode_Type") => facts.code_type = facts.code_type.or(Some(sym.address())),
            _ => {}
        }
    }
    Ok(facts)
}

impl ElfFacts {
    /// The load bias of a mapping of this file at `start` from file offset `offset`: from
    /// the loadable segment the mapping begins in.
    fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let &(vaddr, file_off, _) = self
            .segments
            .iter()
            .find(|&&(_, o, n)| o <= offset && offset < o + n.max(1))?;
        Some((start + file_off).wrapping_sub(offset + vaddr))
    }
}

impl Interpreter {
    /// Finds the interpreter of `pid` from its maps' text.
    pub fn find(pid: u32, maps: &str, cache: &mut ElfCache) -> Result<Found, String> {
        let mut candidates: Vec<(FileMapping, (u8, u8))> = file_mappings(maps)
            .into_iter()
            .filter_map(|m| {
                let version = version_of(m.path.file_name()?.to_str()?)?;
                Some((m, version))
            })
            .collect();
        // The library holds the runtime when there is one; each file by its lowest mapping.
        candidates.sort_by_key(|(m, _)| {
            let lib = m
                .path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("lib"));
            (!lib, m.path.clone(), m.offset, m.start)
        });
        candidates.dedup_by(|a, b| a.0.path == b.0.path);
        let mut last_error = None;
        for (m, version) in candidates {
            let Some(layout) = layout(version.0, version.1) else {
                return Ok(Found::Unsupported {
                    version,
                    path: m.path,
                });
            };
            let facts = cache
                .entry(m.file.clone())
                .or_insert_with(|| elf_facts(pid, &m.path));
            let facts = match facts {
                Ok(f) => f,
                Err(e) => {
                    last_error = Some(e.clone());
                    continue;
                }
            };
            let (Some(runtime), Some(bias)) = (facts.runtime, facts.bias(m.start, m.offset)) else {
                continue;
            };
            return Ok(Found::Python(Interpreter {
                layout,
                runtime: runtime.wrapping_add(bias),
                code_type: facts.code_type.map(|a| a.wrapping_add(bias)),
                path: m.path,
                pthread_tid: None,
            }));
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
        // The native TID where the version keeps one and it is current; otherwise (before
        // 3.11, and in a child forked before the interpreter updated its thread state) the
        // TID glibc keeps in the thread's pthread, which fork updates.
        let mut out = Vec::new();
        let mut rest = Vec::new();
        for (tstate, ident, native) in states {
            match native {
                Some(tid) if tids.contains(&tid) => out.push((tid, tstate)),
                _ => rest.push((tstate, ident)),
            }
        }
        if rest.is_empty() {
            return Ok(out);
        }
        if self.pthread_tid.is_none() {
            let idents: Vec<u64> = rest.iter().map(|r| r.1).collect();
            self.pthread_tid = pthread_tid_offset(mem, &idents, tids);
        }
        let Some(off) = self.pthread_tid else {
            if out.is_empty() {
                return Err("no thread's kernel TID was found in its pthread".into());
            }
            return Ok(out);
        };
        let mut taken: HashSet<u32> = out.iter().map(|o| o.0).collect();
        for (tstate, ident) in rest {
            if let Some(tid) = mem.i32(ident + off).map(|t| t as u32)
                && tids.contains(&tid)
                && taken.insert(tid)
            {
                out.push((tid, tstate));
            }
        }
        Ok(out)
    }
}

/// glibc's offset of `tid` in `struct pthread` for many releases: x86-64 keeps its TCB
/// header first, arm64 (TLS above the thread pointer) does not.
#[cfg(target_arch = "x86_64")]
const GLIBC_PTHREAD_TID: u64 = 0x2d0;
#[cfg(target_arch = "aarch64")]
const GLIBC_PTHREAD_TID: u64 = 0xd0;

/// The offset in `struct pthread` (a `pthread_t` points at it) that holds the kernel TID:
/// the one at which the most threads' pthreads hold distinct TIDs of the process (a thread
/// state can outlive its thread, so not all need to), at least half of them. glibc's own
/// offset wins a tie.
pub fn pthread_tid_offset(mem: &Memory, idents: &[u64], tids: &HashSet<u32>) -> Option<u64> {
    const SCAN: usize = 2048;
    let blocks: Vec<Vec<u8>> = idents.iter().filter_map(|&p| mem.bytes(p, SCAN)).collect();
    let hits = |off: usize| {
        let mut seen = HashSet::new();
        blocks
            .iter()
            .filter(|b| {
                let tid = u32::from_le_bytes(b[off..off + 4].try_into().unwrap_or_default());
                tids.contains(&tid) && seen.insert(tid)
            })
            .count()
    };
    let need = blocks.len().div_ceil(2).max(1);
    let glibc = hits(GLIBC_PTHREAD_TID as usize);
    let (best, count) = (0..SCAN - 4)
        .step_by(4)
        .map(|o| (o, hits(o)))
        .max_by_key(|&(o, n)| (n, std::cmp::Reverse(o)))?;
    if glibc >= need && glibc >= count {
        Some(GLIBC_PTHREAD_TID)
    } else {
        (count >= need).then_some(best as u64)
    }
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
            FileMapping {
                start: 0x7f10,
                offset: 0x2000,
                file: ("08:01".to_string(), 99),
                path: PathBuf::from("/lib/libpython3.11.so.1.0"),
            }
        );
    }

    #[test]
    fn a_version_without_a_layout_is_named_unsupported_before_anything_is_read() {
        let maps = "7f10-7f20 r-xp 00002000 08:01 99 /opt/py/lib/libpython3.14.so.1.0\n";
        let mut cache = ElfCache::new();
        match Interpreter::find(1, maps, &mut cache) {
            Ok(Found::Unsupported { version, path }) => {
                assert_eq!(version, (3, 14));
                assert_eq!(path, PathBuf::from("/opt/py/lib/libpython3.14.so.1.0"));
            }
            other => panic!("{other:?}"),
        }
        assert!(cache.is_empty(), "the file was read");
        let none = "7f10-7f20 r-xp 00000000 08:01 99 /usr/bin/bash\n";
        assert!(matches!(
            Interpreter::find(1, none, &mut cache),
            Ok(Found::NotPython)
        ));
        // A supported version whose file cannot be read is an error that names the file.
        let gone = "7f10-7f20 r-xp 00000000 08:01 98 /nonexistent/libpython3.11.so.1.0\n";
        let err = Interpreter::find(std::process::id(), gone, &mut cache).unwrap_err();
        assert!(err.contains("/nonexistent/libpython3.11.so.1.0"), "{err}");
    }

    #[test]
    fn the_tid_offset_is_found_in_this_process_own_pthreads() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let stop_rx = std::sync::Arc::new(std::sync::Mutex::new(stop_rx));
        let handles: Vec<_> = (0..3)
            .map(|_| {
                let tx = tx.clone();
                let stop = stop_rx.clone();
                std::thread::spawn(move || {
                    // SAFETY: pthread_self has no preconditions.
                    let ident = unsafe { libc::pthread_self() } as u64;
                    // SAFETY: gettid has no preconditions.
                    let tid = unsafe { libc::gettid() } as u32;
                    tx.send((ident, tid)).unwrap();
                    let _ = stop.lock().unwrap().recv();
                })
            })
            .collect();
        let threads: Vec<(u64, u32)> = (0..3).map(|_| rx.recv().unwrap()).collect();
        let pid = std::process::id();
        let mem = Memory::open(pid).unwrap();
        let tids = task_tids(pid);
        let idents: Vec<u64> = threads.iter().map(|t| t.0).collect();
        let off = pthread_tid_offset(&mem, &idents, &tids).expect("an offset");
        for (ident, tid) in &threads {
            assert_eq!(mem.i32(ident + off), Some(*tid as i32));
        }
        // Pthreads of another process's TIDs hold none of these.
        let others: HashSet<u32> = [1].into();
        assert_eq!(pthread_tid_offset(&mem, &idents, &others), None);
        drop(stop_tx);
        for h in handles {
            h.join().unwrap();
        }
    }
}
