//! Turns raw stack addresses into interned, named stacks as samples arrive, while the
//! sampled process still exists: a recording must stay readable after every process in it
//! has exited, so names, not addresses, go into the file.
use std::collections::{HashMap, HashSet};

use blazesym::{
    Addr, Pid,
    symbolize::{
        Input, Symbolized, Symbolizer,
        source::{Elf, Kernel, Process, Source},
    },
};

/// An executable file mapping of a process, as its maps listed it.
struct Mapping {
    range: std::ops::Range<u64>,
    offset: u64,
    path: std::path::PathBuf,
    /// The file's (device major, minor, inode).
    file: (i32, i32, u64),
}

/// A process's executable mappings, as its maps listed them.
#[derive(Default)]
struct Mappings {
    files: Vec<Mapping>,
    /// The others: the vDSO, JIT code (which a perf map may name).
    others: Vec<std::ops::Range<u64>>,
    /// Every mapping that is not executable (data, heap, stacks).
    data: Vec<std::ops::Range<u64>>,
}

/// The lowest address user space cannot have: x86-64's 47-bit address spaces, arm64's
/// 48-bit ones (52 only for a process that asks for it with a high mmap hint).
#[cfg(target_arch = "x86_64")]
pub const USER_END: Addr = 1 << 47;
#[cfg(target_arch = "aarch64")]
pub const USER_END: Addr = 1 << 48;

impl Mappings {
    fn file(&self, a: Addr) -> Option<usize> {
        self.files.iter().position(|m| m.range.contains(&a))
    }

    fn contains(&self, a: Addr) -> bool {
        self.file(a).is_some() || self.others.iter().any(|r| r.contains(&a))
    }

    /// Whether `a` cannot be code: in a mapping that is not executable, or past the end of
    /// user space. The guesses of a frame-pointer walk through code built without them
    /// land there, and are not worth reading the maps again for.
    fn never_code(&self, a: Addr) -> bool {
        a >= USER_END || self.data.iter().any(|r| r.contains(&a))
    }
}

/// A process's executable mappings, or none if they cannot be read.
fn executable_mappings(pid: u32) -> Option<Mappings> {
    use procfs::process::{MMPermissions, MMapPath};
    let maps = procfs::process::Process::new(pid as i32)
        .ok()?
        .maps()
        .ok()?;
    let mut out = Mappings::default();
    for m in maps {
        if !m.perms.contains(MMPermissions::EXECUTE) {
            out.data.push(m.address.0..m.address.1);
            continue;
        }
        match m.pathname {
            MMapPath::Path(path) => out.files.push(Mapping {
                range: m.address.0..m.address.1,
                offset: m.offset,
                path,
                file: (m.dev.0, m.dev.1, m.inode),
            }),
            _ => out.others.push(m.address.0..m.address.1),
        }
    }
    Some(out)
}

/// Interns stacks: the same frames get the same id, and a stack is reported the first time
/// it is seen in each segment of the recording (see [`Stacks::new_segment`]).
#[derive(Default)]
pub struct Stacks {
    ids: HashMap<Vec<String>, u32>,
    /// The ids reported in the current segment.
    written: std::collections::HashSet<u32>,
}

impl Stacks {
    /// Returns the id of `frames`, and the frames when the current segment has not had them
    /// yet (so the caller writes them out).
    pub fn intern(&mut self, frames: Vec<String>) -> (u32, Option<Vec<String>>) {
        let id = match self.ids.get(&frames) {
            Some(&id) => id,
            None => {
                let id = self.ids.len() as u32;
                self.ids.insert(frames.clone(), id);
                id
            }
        };
        (id, self.written.insert(id).then_some(frames))
    }

    /// A new segment file starts: each stack is reported again when first used in it.
    pub fn new_segment(&mut self) {
        self.written.clear();
    }
}

pub struct Namer {
    symbolizer: Symbolizer,
    /// (pid, address) -> name; pid 0 holds kernel addresses.
    cache: HashMap<(u32, u64), String>,
    /// (file, offset) -> name: the DataLoader workers a job forks run the same code at the
    /// same offsets of the same files, and each is named once for all.
    by_offset: HashMap<((i32, i32, u64), u64), String>,
    /// Whether each process sees files where the recorder does.
    shares_our_files: HashMap<u32, bool>,
    /// Each named process's executable mappings, read while it lived: its stacks are named
    /// a few milliseconds after they were taken, and a process that exited in between (a
    /// DataLoader worker at the end of an epoch) is named from its files instead.
    mappings: HashMap<u32, Mappings>,
    /// When each process's mappings were last read.
    mappings_read: HashMap<u32, std::time::Instant>,
    /// Per process, the pages of addresses in none of its executable mappings when they were
    /// last read (a stray return address): they do not make it read them again, and nothing
    /// can name them.
    unmapped: HashMap<u32, HashSet<u64>>,
}

/// Pages remembered as unmapped per process, at most: past that, they are forgotten.
const UNMAPPED_PAGES: usize = 4096;

/// The shortest wait between two reads of a process's mappings for addresses in none of
/// them (JIT code, the vDSO, a stray return address).
const MAPPINGS_REREAD: std::time::Duration = std::time::Duration::from_millis(500);

impl Default for Namer {
    fn default() -> Self {
        Self {
            symbolizer: Symbolizer::new(),
            cache: HashMap::new(),
            by_offset: HashMap::new(),
            shares_our_files: HashMap::new(),
            mappings: HashMap::new(),
            mappings_read: HashMap::new(),
            unmapped: HashMap::new(),
        }
    }
}

/// The address of the kernel's `_text`, which /proc/kallsyms lists near its start.
fn kernel_text_address() -> Option<u64> {
    use std::io::BufRead as _;
    let file = std::fs::File::open("/proc/kallsyms").ok()?;
    std::io::BufReader::new(file)
        .lines()
        .take(1000)
        .map_while(Result::ok)
        .find_map(|line| {
            let mut fields = line.split_whitespace();
            let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
            (fields.nth(1)? == "_text" && addr != 0).then_some(addr)
        })
}

/// The addresses of a `bpf_get_stack` buffer, leaf first. `len` is the helper's byte count.
pub fn frames(buf: &[u64], len: i32) -> &[u64] {
    let n = (len.max(0) as usize / 8).min(buf.len());
    &buf[..n]
}

/// Return addresses point after the call; step back one byte so that a call that ends a
/// function is named by that function, as perf does. The leaf is a real PC.
fn lookup_addrs(addrs: &[u64]) -> Vec<Addr> {
    addrs
        .iter()
        .enumerate()
        .map(|(i, &a)| if i == 0 { a } else { a.saturating_sub(1) })
        .collect()
}

impl Namer {
    fn names(&mut self, pid: u32, addrs: &[u64], kernel: bool) -> Vec<String> {
        let key_pid = if kernel { 0 } else { pid };
        let lookup = lookup_addrs(addrs);
        let mut missing: Vec<Addr> = lookup
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(&(key_pid, *a)))
            .collect();
        missing.sort_unstable();
        missing.dedup();
        if !kernel && !missing.is_empty() {
            missing = self.names_from_files(pid, &missing);
            // blazesym would read the whole maps again to find nothing there.
            missing.retain(|&a| {
                let nowhere = self.unmapped(pid, a);
                if nowhere {
                    self.cache.insert((pid, a), "[unknown]".to_string());
                }
                !nowhere
            });
        }
        if !missing.is_empty() {
            let src = if kernel {
                Source::Kernel(Kernel::default())
            } else {
                Source::Process(Process::new(Pid::from(pid)))
            };
            // Names, or `None` for the whole lookup when the process could not be read.
            let resolved: Option<Vec<Option<String>>> = self
                .symbolizer
                .symbolize(&src, Input::AbsAddr(&missing))
                .ok()
                .map(|r| {
                    r.iter()
                        .map(|s| match s {
                            Symbolized::Sym(sym) => Some(sym.name.to_string()),
                            _ => None,
                        })
                        .collect()
                });
            if !kernel && resolved.is_some() {
                self.remember_mappings(pid, &missing);
            }
            for (i, addr) in missing.iter().enumerate() {
                let name = match &resolved {
                    Some(names) => names.get(i).cloned().flatten(),
                    None if !kernel => self.name_from_file(pid, *addr),
                    None => None,
                }
                .unwrap_or_else(|| "[unknown]".to_string());
                let name = if kernel { format!("{name}_[k]") } else { name };
                self.cache.insert((key_pid, *addr), name);
            }
        }
        lookup
            .iter()
            .map(|a| self.cache[&(key_pid, *a)].clone())
            .collect()
    }

    /// Keeps `pid`'s mappings, read again when one of `addrs` lies in none of them (a
    /// library loaded since), at most every [`MAPPINGS_REREAD`].
    fn remember_mappings(&mut self, pid: u32, addrs: &[Addr]) {
        let page = |a: &Addr| a >> 12;
        let unmapped = self.unmapped.entry(pid).or_default();
        let known = self.mappings.get(&pid).is_some_and(|maps| {
            addrs
                .iter()
                .all(|a| maps.contains(*a) || maps.never_code(*a) || unmapped.contains(&page(a)))
        });
        let now = std::time::Instant::now();
        let recent = self
            .mappings_read
            .get(&pid)
            .is_some_and(|at| now.duration_since(*at) < MAPPINGS_REREAD);
        if !known
            && !recent
            && let Some(maps) = executable_mappings(pid)
        {
            if unmapped.len() > UNMAPPED_PAGES {
                unmapped.clear();
            }
            unmapped.extend(addrs.iter().filter(|a| !maps.contains(**a)).map(page));
            self.mappings.insert(pid, maps);
            self.mappings_read.insert(pid, now);
        }
    }

    /// Whether `addr` of `pid` cannot be named: it is no code, or lay in no executable
    /// mapping when they were last read.
    fn unmapped(&self, pid: u32, addr: Addr) -> bool {
        let Some(maps) = self.mappings.get(&pid) else {
            return false;
        };
        !maps.contains(addr)
            && (maps.never_code(addr)
                || self
                    .unmapped
                    .get(&pid)
                    .is_some_and(|pages| pages.contains(&(addr >> 12))))
    }

    /// Names the addresses of `pid` that lie in its known file mappings from the mapped
    /// files (by file offset), and returns the others. blazesym's process source reads the
    /// process's whole maps for every lookup, which for a torch process (hundreds of
    /// mappings) cost more than the naming itself.
    fn names_from_files(&mut self, pid: u32, addrs: &[Addr]) -> Vec<Addr> {
        self.remember_mappings(pid, addrs);
        let Some(maps) = self.mappings.get(&pid) else {
            return addrs.to_vec();
        };
        let mut rest = Vec::new();
        let mut by_file: HashMap<usize, Vec<(Addr, u64)>> = HashMap::new();
        for &a in addrs {
            match maps.file(a) {
                Some(i) => {
                    let m = &maps.files[i];
                    let offset = a - m.range.start + m.offset;
                    match self.by_offset.get(&(m.file, offset)) {
                        Some(name) => {
                            self.cache.insert((pid, a), name.clone());
                        }
                        None => by_file.entry(i).or_default().push((a, offset)),
                    }
                }
                None => rest.push(a),
            }
        }
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        let ours = *self
            .shares_our_files
            .entry(pid)
            .or_insert_with(|| crate::capture::proc::target::shares_our_files(pid));
        for (i, found) in by_file {
            let m = &maps.files[i];
            // The file as the process sees it: through its root, for one in a container.
            let path = if alive && !ours {
                std::path::Path::new(&format!("/proc/{pid}/root"))
                    .join(m.path.strip_prefix("/").unwrap_or(&m.path))
            } else {
                m.path.clone()
            };
            let offsets: Vec<u64> = found.iter().map(|f| f.1).collect();
            let src = Source::Elf(Elf::new(path));
            let Ok(named) = self.symbolizer.symbolize(&src, Input::FileOffset(&offsets)) else {
                rest.extend(found.iter().map(|f| f.0));
                continue;
            };
            for ((addr, offset), sym) in found.iter().zip(named.iter()) {
                let name = match sym {
                    Symbolized::Sym(sym) => sym.name.to_string(),
                    _ => "[unknown]".to_string(),
                };
                self.by_offset.insert((m.file, *offset), name.clone());
                self.cache.insert((pid, *addr), name);
            }
        }
        rest
    }

    /// Names an address of a process that is gone, from the file it was mapped from.
    fn name_from_file(&mut self, pid: u32, addr: Addr) -> Option<String> {
        let m = self
            .mappings
            .get(&pid)?
            .files
            .iter()
            .find(|m| m.range.contains(&addr))?;
        let offset = addr - m.range.start + m.offset;
        let src = Source::Elf(Elf::new(m.path.clone()));
        match self
            .symbolizer
            .symbolize_single(&src, Input::FileOffset(offset))
        {
            Ok(Symbolized::Sym(sym)) => Some(sym.name.to_string()),
            _ => None,
        }
    }

    /// Loads the kernel's symbols now. The first kernel stack would otherwise do it: a read
    /// and parse of /proc/kallsyms that takes a tenth of a second of CPU, which should be
    /// spent before the programs attach rather than while the target is traced.
    pub fn load_kernel_symbols(&mut self) {
        if let Some(addr) = kernel_text_address() {
            self.names(0, &[addr], true);
        }
    }

    /// Names a sampled stack (addresses leaf first), root first: user frames, then kernel
    /// frames.
    pub fn name_stack(&mut self, pid: u32, user: &[u64], kernel: &[u64]) -> Vec<String> {
        self.name_stack_parts(pid, user, kernel).0
    }

    /// [`Self::name_stack`], and how many of its frames (from the root) are user frames.
    pub fn name_stack_parts(
        &mut self,
        pid: u32,
        user: &[u64],
        kernel: &[u64],
    ) -> (Vec<String>, usize) {
        let mut out: Vec<String> = self.names(pid, user, false);
        out.reverse();
        let user_len = out.len();
        let mut k = self.names(pid, kernel, true);
        // The capture itself runs inside the sched_switch program: not the thread's stack.
        // The program's own frame is not always named as one (a JIT image between kernel
        // symbols takes the name before it), so everything up to the tracepoint's
        // trampoline goes.
        let own = k
            .iter()
            .take(4)
            .rposition(|f| {
                f.starts_with("bpf_prog_")
                    || f.starts_with("bpf_trace_run")
                    || f.starts_with("__bpf_trace")
            })
            .map_or(0, |i| i + 1);
        k.drain(..own);
        k.reverse();
        out.extend(k);
        if out.is_empty() {
            out.push("[no stack]".to_string());
        }
        (out, user_len)
    }

    /// Names the function a return address returns into: the caller of a probed function.
    pub fn name_return_address(&mut self, pid: u32, addr: u64) -> String {
        if addr == 0 {
            return String::new();
        }
        // Index 1 marks it a return address (looked up one byte back).
        self.names(pid, &[0, addr], false).pop().unwrap_or_default()
    }

    /// `pid` mapped new code: addresses that lay in none of its mappings are looked up again.
    pub fn new_code(&mut self, pid: u32) {
        self.unmapped.remove(&pid);
    }

    /// Forgets a process's user addresses (after exec its mappings changed).
    pub fn forget(&mut self, pid: u32) {
        self.cache.retain(|(p, _), _| *p != pid);
        self.mappings.remove(&pid);
        self.mappings_read.remove(&pid);
        self.unmapped.remove(&pid);
        self.shares_our_files.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interning_reuses_ids() {
        let mut s = Stacks::default();
        let (a, new_a) = s.intern(vec!["main".into(), "f".into()]);
        let (b, new_b) = s.intern(vec!["main".into(), "g".into()]);
        let (c, new_c) = s.intern(vec!["main".into(), "f".into()]);
        assert_eq!((a, b, c), (0, 1, 0));
        assert!(new_a.is_some() && new_b.is_some() && new_c.is_none());
        s.new_segment();
        let (d, new_d) = s.intern(vec!["main".into(), "f".into()]);
        let (_, new_e) = s.intern(vec!["main".into(), "f".into()]);
        assert_eq!(d, 0, "ids hold across segments");
        assert!(
            new_d.is_some() && new_e.is_none(),
            "written once per segment"
        );
    }

    #[test]
    fn stack_lengths_are_clamped() {
        let buf = [1u64, 2, 3];
        assert_eq!(frames(&buf, 16), &[1, 2]);
        assert_eq!(frames(&buf, -14), &[] as &[u64]);
        assert_eq!(frames(&buf, 800), &[1, 2, 3]);
        assert_eq!(lookup_addrs(&[10, 20]), vec![10, 19]);
    }

    /// Where `addr` of this process lies in `pid`, which maps the same file.
    fn same_place_in(pid: u32, addr: u64) -> u64 {
        let ours = executable_mappings(std::process::id()).unwrap();
        let m = &ours.files[ours.file(addr).unwrap()];
        let theirs = executable_mappings(pid).unwrap();
        let t = theirs.files.iter().find(|t| t.path == m.path).unwrap();
        addr - m.range.start + m.offset - t.offset + t.range.start
    }

    #[test]
    fn a_process_that_exited_is_named_from_its_files() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id();
        // The loader maps libc before `sleep` runs; wait until it has.
        let libc_fn = libc::getpid as *const () as u64;
        let mut tries = 0;
        while executable_mappings(pid).is_none_or(|maps| {
            !maps
                .files
                .iter()
                .any(|m| m.path.to_string_lossy().contains("libc"))
        }) {
            tries += 1;
            assert!(tries < 500, "sleep never mapped libc");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let mut n = Namer::default();
        let alive = same_place_in(pid, libc::nanosleep as *const () as u64);
        assert!(n.names(pid, &[alive], false)[0].contains("sleep"));
        let later = same_place_in(pid, libc_fn);
        child.kill().unwrap();
        child.wait().unwrap();
        let names = n.names(pid, &[later], false);
        assert!(names[0].contains("getpid"), "{names:?}");
    }

    #[test]
    fn names_this_process_own_function() {
        let mut n = Namer::default();
        let addr = names_this_process_own_function as *const () as u64 + 1;
        let names = n.names(std::process::id(), &[addr], false);
        assert!(
            names[0].contains("names_this_process_own_function"),
            "{names:?}"
        );
    }
}
