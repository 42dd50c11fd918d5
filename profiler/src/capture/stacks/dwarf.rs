//! Unwinding a copy of the top of a user stack with the DWARF CFI (`.eh_frame`) of the
//! objects the process has mapped, so that code built without frame pointers (CPython,
//! libtorch, glibc's hand-written parts, Rust release builds) does not end the stack.
//!
//! framehop (samply's unwinder) does the unwinding; this module tells it, per process, which
//! objects are mapped where, reading each object's unwind sections from its file (memory
//! mapped, shared by every process that maps the same file).
use std::{
    collections::{HashMap, HashSet},
    fs::File,
    ops::{Deref, Range},
    sync::Arc,
    time::{Duration, Instant},
};

use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};
use memmap2::Mmap;
use object::{Object as _, ObjectSection as _, ObjectSegment as _};

/// The registers an unwind starts from and the stack bytes above `sp`, as the kernel copied
/// them when the sample was taken.
#[derive(Clone, Copy, Debug)]
pub struct StackCopy<'a> {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The link register (aarch64); unused on x86-64.
    pub lr: u64,
    /// A return address a return probe replaced with its trampoline's: (the stack slot
    /// holding it, the real address), from the probe's entry.
    pub ret_fix: Option<(u64, u64)>,
    pub bytes: &'a [u8],
}

/// How far an unwind got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Quality {
    /// It reached the thread's first frame.
    Complete,
    /// It found frames but stopped before the first one (stack copy too short, no unwind
    /// information, a broken frame chain).
    Truncated,
    /// It found no user frame at all.
    Failed,
}

/// One unwind of a stack copy.
#[derive(Clone, Debug)]
pub struct Walk {
    /// Return addresses, leaf first (the leaf is the sampled PC).
    pub frames: Vec<u64>,
    pub quality: Quality,
    /// For a complete walk: one byte past the highest stack address it read. The thread's
    /// first frames stay where they are for its life, so a later copy of this thread's stack
    /// that reaches here holds everything a walk needs, however deep the sample.
    pub end: Option<u64>,
    /// The walk wanted a word past the end of the copy.
    pub ran_off: bool,
}

/// What differs between the architectures the recorder runs on: framehop's unwinder, and
/// where a return address is before the callee's prologue stores it.
#[cfg(target_arch = "x86_64")]
mod arch {
    pub use framehop::x86_64::{CacheX86_64 as Cache, UnwinderX86_64 as Unwinder};

    use super::StackCopy;

    /// `call` pushes the return address: a return probe's entry saw the slot it will be in.
    pub const RETURN_SLOT_KNOWN: bool = true;

    pub fn regs(copy: &StackCopy<'_>, _lr: u64) -> framehop::x86_64::UnwindRegsX86_64 {
        framehop::x86_64::UnwindRegsX86_64::new(copy.ip, copy.sp, copy.bp)
    }

    /// x86-64 has no pointer authentication.
    pub fn strip(addr: u64) -> u64 {
        addr
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    pub use framehop::aarch64::{CacheAarch64 as Cache, UnwinderAarch64 as Unwinder};
    use framehop::aarch64::{PtrAuthMask, UnwindRegsAarch64};

    use super::StackCopy;

    /// `bl` leaves the return address in LR, and the prologue stores it where it chooses: a
    /// return probe's entry cannot know the slot (one probed call is in flight per thread).
    pub const RETURN_SLOT_KNOWN: bool = false;

    /// Return addresses signed by pointer authentication (`paciasp`, the default of
    /// Ubuntu's and Fedora's arm64 builds) carry their signature above the address bits.
    fn mask() -> PtrAuthMask {
        PtrAuthMask::from_max_known_address(super::super::symbolize::USER_END - 1)
    }

    pub fn regs(copy: &StackCopy<'_>, lr: u64) -> UnwindRegsAarch64 {
        UnwindRegsAarch64::new_with_ptr_auth_mask(mask(), lr, copy.sp, copy.bp)
    }

    pub fn strip(addr: u64) -> u64 {
        mask().strip_ptr_auth(addr)
    }
}

/// Deepest stack kept: a runaway recursion would otherwise make each sample's stack as long
/// as the copy allows.
pub const MAX_FRAMES: usize = 512;

/// A section of a memory-mapped object file.
#[derive(Clone)]
pub struct Section {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }
}

/// What framehop needs from one object file, independent of where it is mapped.
struct ObjectInfo {
    map: Arc<Mmap>,
    /// (vaddr, file offset, file size) of each loadable segment, to place a mapping.
    segments: Vec<(u64, u64, u64)>,
    sections: HashMap<&'static str, (Range<u64>, Range<usize>)>,
}

const SECTIONS: [&str; 5] = [
    ".text",
    ".eh_frame",
    ".eh_frame_hdr",
    ".debug_frame",
    ".got",
];

impl ObjectInfo {
    fn read(file: &File) -> Result<Self, String> {
        // SAFETY: a read-only private mapping; a file truncated underneath would fault, as for
        // any reader of shared libraries, and libraries in use are not rewritten in place.
        let map = unsafe { Mmap::map(file) }.map_err(|e| e.to_string())?;
        let elf = object::File::parse(&*map).map_err(|e| format!("not an ELF object: {e}"))?;
        let segments = elf
            .segments()
            .map(|s| {
                let (off, size) = s.file_range();
                (s.address(), off, size)
            })
            .collect();
        let mut sections = HashMap::new();
        for name in SECTIONS {
            if let Some(s) = elf.section_by_name(name) {
                let svma = s.address()..s.address() + s.size();
                let file = s
                    .file_range()
                    .map(|(o, n)| o as usize..(o + n) as usize)
                    .filter(|r| r.end <= map.len())
                    .unwrap_or(0..0);
                sections.insert(name, (svma, file));
            }
        }
        drop(elf);
        Ok(ObjectInfo {
            map: Arc::new(map),
            segments,
            sections,
        })
    }

    fn has_unwind_info(&self) -> bool {
        [".eh_frame", ".debug_frame"]
            .iter()
            .any(|n| self.sections.get(n).is_some_and(|(_, f)| !f.is_empty()))
    }

    fn svma(&self, name: &str) -> Option<Range<u64>> {
        self.sections.get(name).map(|(s, _)| s.clone())
    }

    fn data(&self, name: &str) -> Option<Section> {
        self.sections
            .get(name)
            .filter(|(_, f)| !f.is_empty())
            .map(|(_, f)| Section {
                map: self.map.clone(),
                range: f.clone(),
            })
    }

    /// The address at which this object's vaddr 0 lies, given that file offset `offset` (page
    /// aligned) is mapped at `start`: from the loadable segment that mapping begins, the
    /// last one starting in or before its first page (segments share pages at their ends).
    fn bias(&self, start: u64, offset: u64) -> Option<u64> {
        let page = page_size();
        let (vaddr, file_off, _) = self
            .segments
            .iter()
            .copied()
            .filter(|&(_, o, n)| o & !(page - 1) <= offset && offset < o + n.max(1))
            .max_by_key(|&(_, o, _)| o)?;
        (start + file_off).checked_sub(offset + vaddr)
    }

    fn module(&self, name: String, avma: Range<u64>, bias: u64) -> Module<Section> {
        Module::new(
            name,
            avma,
            bias,
            ExplicitModuleSectionInfo {
                base_svma: 0,
                text_svma: self.svma(".text"),
                text: self.data(".text"),
                got_svma: self.svma(".got"),
                eh_frame_svma: self.svma(".eh_frame"),
                eh_frame: self.data(".eh_frame"),
                eh_frame_hdr_svma: self.svma(".eh_frame_hdr"),
                eh_frame_hdr: self.data(".eh_frame_hdr"),
                debug_frame: self.data(".debug_frame"),
                stubs_svma: None,
                stub_helper_svma: None,
                unwind_info: None,
                text_segment_svma: None,
                text_segment: None,
            },
        )
    }
}

/// The kernel's page size: 4 KiB on x86-64, 64 KiB on many arm64 kernels (Grace's among
/// them), where a segment's mapping starts at a 64 KiB boundary.
fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    })
}

/// One process's mapped objects, as framehop sees them.
struct ProcessObjects {
    unwinder: arch::Unwinder<Section>,
    /// framehop's cache of unwind rules by address, per process: with one for all, the
    /// workers of a job evicted each other's rules.
    cache: Box<arch::Cache>,
    code: Vec<Range<u64>>,
    /// The kernel's return-probe trampoline page (`[uprobes]`), once a return probe fired.
    trampoline: Option<Range<u64>>,
    /// Pages of return addresses still in no object after the maps were read again.
    unmapped_pages: HashSet<u64>,
    /// The mappings that are not executable: a return address there is a wrong guess.
    data: Vec<Range<u64>>,
    read_at: Instant,
}

impl ProcessObjects {
    fn covers(&self, addr: u64) -> bool {
        self.code.iter().any(|r| r.contains(&addr))
            || self.trampoline.as_ref().is_some_and(|t| t.contains(&addr))
    }

    /// Whether `addr` cannot be code: in a mapping that is not executable, or past the end
    /// of user space.
    fn never_code(&self, addr: u64) -> bool {
        addr >= super::symbolize::USER_END || self.data.iter().any(|r| r.contains(&addr))
    }
}

/// A process's maps are read again when a walk meets a return address in a page none of its
/// known objects covered at the last read, no more often than this. A page already looked
/// for is not looked for again until the process maps new code ([`Dwarf::new_code`]).
const REREAD_SOON: Duration = Duration::from_millis(20);

/// The DWARF unwinder's state across samples.
#[derive(Default)]
pub struct Dwarf {
    processes: HashMap<u32, ProcessObjects>,
    /// Object files by (device, inode); `None`: unreadable, warned about once.
    objects: HashMap<(u64, u64), Option<Arc<ObjectInfo>>>,
    /// Named problems, each once: an object with no unwind information or that could not
    /// be read, a process gone before its maps were read.
    pub warnings: Vec<String>,
    warned: HashSet<String>,
}

impl Dwarf {
    fn warn(&mut self, warning: String) {
        if self.warned.insert(warning.clone()) {
            log::warn!("{warning}");
            self.warnings.push(warning);
        }
    }

    fn object(&mut self, pid: u32, dev: u64, inode: u64, path: &str) -> Option<Arc<ObjectInfo>> {
        if let Some(o) = self.objects.get(&(dev, inode)) {
            return o.clone();
        }
        // The process's own view of the path: it may run in another mount namespace.
        let opened = File::open(format!("/proc/{pid}/root{path}"))
            .or_else(|_| File::open(path))
            .map_err(|e| e.to_string())
            .and_then(|f| ObjectInfo::read(&f));
        let info = match opened {
            Ok(info) => {
                if !info.has_unwind_info() {
                    self.warn(format!(
                        "{path} has no unwind information (.eh_frame or .debug_frame): stacks \
                         through it are walked by frame pointers"
                    ));
                }
                Some(Arc::new(info))
            }
            Err(e) => {
                self.warn(format!(
                    "cannot read {path} for unwinding ({e}): stacks through it are walked by \
                     frame pointers"
                ));
                None
            }
        };
        self.objects.insert((dev, inode), info.clone());
        info
    }

    fn read_process(&mut self, pid: u32) -> Option<ProcessObjects> {
        let maps = match procfs::process::Process::new(pid as i32).and_then(|p| p.maps()) {
            Ok(m) => m,
            Err(e) => {
                self.warn(format!(
                    "cannot read the mappings of PID {pid} ({e}); its stacks are walked by \
                     frame pointers"
                ));
                return None;
            }
        };
        let mut unwinder = arch::Unwinder::new();
        let mut code = Vec::new();
        let mut trampoline = None;
        let mut data = Vec::new();
        for m in maps {
            if !m.perms.contains(procfs::process::MMPermissions::EXECUTE) {
                data.push(m.address.0..m.address.1);
                continue;
            }
            let path = match &m.pathname {
                procfs::process::MMapPath::Path(path) => path,
                procfs::process::MMapPath::Other(name) if name == "uprobes" => {
                    trampoline = Some(m.address.0..m.address.1);
                    continue;
                }
                _ => continue,
            };
            let path = path.to_string_lossy().into_owned();
            let (major, minor) = m.dev;
            let dev = (u64::from(major as u32) << 32) | u64::from(minor as u32);
            let Some(info) = self.object(pid, dev, m.inode, &path) else {
                continue;
            };
            let avma = m.address.0..m.address.1;
            let Some(bias) = info.bias(avma.start, m.offset) else {
                continue;
            };
            code.push(avma.clone());
            unwinder.add_module(info.module(path, avma, bias));
        }
        Some(ProcessObjects {
            unwinder,
            cache: Box::new(arch::Cache::new()),
            code,
            trampoline,
            unmapped_pages: HashSet::new(),
            data,
            read_at: Instant::now(),
        })
    }

    /// Unwinds `copy` of a thread of `pid`.
    pub fn unwind(&mut self, pid: u32, copy: &StackCopy<'_>) -> Walk {
        let failed = |frames, quality| Walk {
            frames,
            quality,
            end: None,
            ran_off: false,
        };
        if copy.ip == 0 {
            return failed(Vec::new(), Quality::Failed);
        }
        if !self.processes.contains_key(&pid) && !self.reread(pid) {
            return failed(vec![copy.ip], Quality::Truncated);
        }
        let walk = self.walk(pid, copy);
        if walk.quality == Quality::Complete {
            return walk;
        }
        // The first frame in no known object is a real return address (the ones past it are
        // frame-pointer guesses): into a library loaded since the maps were read, or the
        // return-probe trampoline, mapped at the first probe's return. A new such page is
        // looked up at once, at most every `REREAD_SOON`; a garbage return address (the
        // frame-pointer guesses past a real end) would otherwise read the maps every time.
        let process = &self.processes[&pid];
        let Some(page) = walk
            .frames
            .iter()
            .find(|&&a| !process.covers(a))
            .filter(|&&a| !process.never_code(a))
            .map(|a| a >> 12)
        else {
            return walk;
        };
        let since = process.read_at.elapsed();
        let new_page = !process.unmapped_pages.contains(&page);
        if new_page && since >= REREAD_SOON && self.reread(pid) {
            let walk = self.walk(pid, copy);
            let process = self.processes.get_mut(&pid).expect("just read");
            if !process.covers(page << 12) {
                process.unmapped_pages.insert(page);
            }
            return walk;
        }
        walk
    }

    /// Reads `pid`'s mappings (again); false when they cannot be read.
    fn reread(&mut self, pid: u32) -> bool {
        match self.read_process(pid) {
            Some(mut p) => {
                if let Some(old) = self.processes.remove(&pid) {
                    p.unmapped_pages = old.unmapped_pages;
                }
                self.processes.insert(pid, p);
                true
            }
            None => false,
        }
    }

    fn walk(&mut self, pid: u32, copy: &StackCopy<'_>) -> Walk {
        let Some(process) = self.processes.get_mut(&pid) else {
            return Walk {
                frames: Vec::new(),
                quality: Quality::Failed,
                end: None,
                ran_off: false,
            };
        };
        let (sp, bytes) = (copy.sp, copy.bytes);
        let trampoline = process.trampoline.clone().unwrap_or(0..0);
        // A return address the kernel swapped for its return probe's trampoline: the real
        // one is known for the probed call the thread is in, and no other.
        let unswap = |word: u64, slot: Option<u64>| -> Result<u64, ()> {
            if !trampoline.contains(&arch::strip(word)) {
                return Ok(word);
            }
            match copy.ret_fix {
                Some((at, real)) if !arch::RETURN_SLOT_KNOWN || slot == Some(at) => Ok(real),
                _ => Err(()),
            }
        };
        let (mut highest, mut ran_off) = (0u64, false);
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let off = addr.checked_sub(sp).ok_or(())? as usize;
            let Some(word) = bytes.get(off..off.checked_add(8).ok_or(())?) else {
                ran_off = true;
                return Err(());
            };
            highest = highest.max(addr.saturating_add(8));
            unswap(
                u64::from_le_bytes(word.try_into().map_err(|_| ())?),
                Some(addr),
            )
        };
        // A leaf's return address still in LR (aarch64) may be the trampoline's too; 0
        // (x86-64, or no LR) stays 0.
        let lr = unswap(copy.lr, None).unwrap_or(0);
        let mut frames = process.unwinder.iter_frames(
            copy.ip,
            arch::regs(copy, lr),
            &mut process.cache,
            &mut read_stack,
        );
        let mut out = Vec::new();
        let quality = loop {
            if out.len() >= MAX_FRAMES {
                break Quality::Truncated;
            }
            match frames.next() {
                Ok(Some(frame)) => out.push(frame.address()),
                Ok(None) => break Quality::Complete,
                Err(_) => break Quality::Truncated,
            }
        };
        Walk {
            frames: out,
            quality,
            // A read that failed may have been papered over (framehop falls back to frame
            // pointers), so a walk that ran off its copy teaches no end.
            end: (quality == Quality::Complete && !ran_off && highest > sp).then_some(highest),
            ran_off,
        }
    }

    /// `pid` mapped new code: the pages it was looked for in before are looked in again.
    pub fn new_code(&mut self, pid: u32) {
        if let Some(p) = self.processes.get_mut(&pid) {
            p.unmapped_pages.clear();
        }
    }

    /// Forgets a process's objects (it exec'ed, or exited).
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The end of the mapping holding `addr` in this process.
    fn mapping_end(addr: u64) -> u64 {
        let maps = procfs::process::Process::myself().unwrap().maps().unwrap();
        maps.iter()
            .find(|m| (m.address.0..m.address.1).contains(&addr))
            .map(|m| m.address.1)
            .unwrap()
    }

    /// The registers an unwind starts from: pc, sp, frame pointer and link register.
    type Regs = (u64, u64, u64, u64);

    /// The registers and a copy of the stack of the calling thread, taken inside this
    /// function (which is never inlined, so it has a frame of its own).
    #[inline(never)]
    fn snapshot(buf: &mut [u8]) -> Regs {
        let (ip, sp, bp, lr): Regs;
        // SAFETY: reads registers; no memory is touched.
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!(
                "lea {ip}, [rip]",
                "mov {sp}, rsp",
                "mov {bp}, rbp",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
            );
            lr = 0;
        }
        // SAFETY: as above.
        #[cfg(target_arch = "aarch64")]
        unsafe {
            std::arch::asm!(
                "adr {ip}, .",
                "mov {sp}, sp",
                "mov {bp}, x29",
                "mov {lr}, x30",
                ip = out(reg) ip,
                sp = out(reg) sp,
                bp = out(reg) bp,
                lr = out(reg) lr,
            );
        }
        let len = buf.len().min((mapping_end(sp) - sp) as usize);
        // SAFETY: the bytes from `sp` to the end of its mapping are this thread's stack (and
        // what the thread library keeps above it), all readable.
        unsafe { std::ptr::copy_nonoverlapping(sp as *const u8, buf.as_mut_ptr(), len) };
        std::hint::black_box((ip, sp, bp, lr))
    }

    #[inline(never)]
    fn deep_caller_marker(depth: u32, buf: &mut [u8]) -> Regs {
        if depth == 0 {
            return snapshot(buf);
        }
        let r = deep_caller_marker(std::hint::black_box(depth - 1), buf);
        std::hint::black_box(r)
    }

    /// The stack copy a sample with these registers would carry.
    fn copy_of((ip, sp, bp, lr): Regs, bytes: &[u8]) -> StackCopy<'_> {
        StackCopy {
            ip,
            sp,
            bp,
            lr,
            ret_fix: None,
            bytes,
        }
    }

    /// Unwinds a copy of this thread's stack taken `depth` calls deep.
    fn unwind_own_stack(depth: u32) -> (Vec<u64>, Quality, Dwarf) {
        let mut buf = vec![0u8; 64 * 1024];
        let regs = deep_caller_marker(depth, &mut buf);
        let mut dwarf = Dwarf::default();
        let walk = dwarf.unwind(std::process::id(), &copy_of(regs, &buf));
        (walk.frames, walk.quality, dwarf)
    }

    #[test]
    fn unwinds_this_thread_through_its_callers() {
        let (addrs, quality, dwarf) = unwind_own_stack(3);
        let mut namer = super::super::Namer::default();
        let frames = namer.name_stack(std::process::id(), &addrs, &[]);
        let markers = frames
            .iter()
            .filter(|f| f.contains("deep_caller_marker"))
            .count();
        // Four calls, the last of which may be a tail call.
        assert!(markers >= 3, "{frames:#?}");
        assert_eq!(quality, Quality::Complete, "{frames:#?}");
        assert!(dwarf.warnings.is_empty(), "{:?}", dwarf.warnings);
        // The walk goes on past the test (whose own frame the compiler may fold into the
        // harness's) to where the thread started.
        assert!(
            super::super::THREAD_ROOTS.contains(&frames[0].as_str()),
            "{frames:#?}"
        );
    }

    /// The same walk judged by addresses alone, so that it holds where this process's
    /// symbols cannot be read back through /proc (under qemu-user, which runs the aarch64
    /// build of this test): every frame of the recursion returns into `deep_caller_marker`.
    #[test]
    fn unwinds_this_thread_through_its_callers_by_address() {
        const DEPTH: u32 = 8;
        let (addrs, quality, dwarf) = unwind_own_stack(DEPTH);
        let start = deep_caller_marker as *const () as u64;
        // The function is a few dozen instructions; its neighbours hold at most two frames.
        let inside = addrs
            .iter()
            .filter(|&&a| (start..start + 1024).contains(&a))
            .count();
        assert!(inside >= DEPTH as usize - 1, "{inside} of {addrs:x?}");
        assert_eq!(quality, Quality::Complete, "{addrs:x?}");
        assert!(dwarf.warnings.is_empty(), "{:?}", dwarf.warnings);
    }

    /// What lets the kernel copy less: the end a complete walk reports holds for a copy
    /// taken deeper in the same thread, and a copy cut there walks as the whole one does.
    #[test]
    fn a_copy_cut_at_a_walks_end_walks_the_same() {
        let mut dwarf = Dwarf::default();
        let mut shallow_buf = vec![0u8; 64 * 1024];
        let shallow = deep_caller_marker(2, &mut shallow_buf);
        let first = dwarf.unwind(std::process::id(), &copy_of(shallow, &shallow_buf));
        assert_eq!(first.quality, Quality::Complete, "{:x?}", first.frames);
        let end = first.end.expect("a complete walk has an end");
        let (ip, sp, ..) = shallow;
        assert!(
            end > sp && end - sp < shallow_buf.len() as u64,
            "{end:x} {sp:x}"
        );
        assert!(!first.ran_off);

        let mut buf = vec![0u8; 64 * 1024];
        let deep = deep_caller_marker(12, &mut buf);
        let full = dwarf.unwind(std::process::id(), &copy_of(deep, &buf));
        let cut = (end - deep.1) as usize;
        assert!(cut < buf.len(), "the deeper sample's copy reaches the end");
        let short = dwarf.unwind(std::process::id(), &copy_of(deep, &buf[..cut]));
        assert_eq!(short.quality, Quality::Complete, "{:x?}", short.frames);
        assert_eq!(short.frames, full.frames);
        assert_eq!(short.end, Some(end), "{ip:x}");
    }

    #[test]
    fn a_short_copy_truncates_and_no_registers_fail() {
        let mut buf = vec![0u8; 64 * 1024];
        let regs = deep_caller_marker(40, &mut buf);
        let mut dwarf = Dwarf::default();
        let full = copy_of(regs, &buf);
        let short = StackCopy {
            bytes: &buf[..256],
            ..full
        };
        let all = dwarf.unwind(std::process::id(), &full).frames;
        let walk = dwarf.unwind(std::process::id(), &short);
        let (some, quality) = (walk.frames, walk.quality);
        assert!(walk.ran_off && walk.end.is_none());
        assert_eq!(quality, Quality::Truncated);
        assert!(
            !some.is_empty() && some.len() < all.len(),
            "{some:?} {all:?}"
        );
        assert_eq!(some[..], all[..some.len()]);
        let none = StackCopy { ip: 0, ..full };
        assert_eq!(
            dwarf.unwind(std::process::id(), &none).quality,
            Quality::Failed
        );
    }

    #[test]
    fn a_process_that_is_gone_is_named_once() {
        let buf = [0u8; 64];
        let copy = StackCopy {
            ip: 0x1000,
            sp: 0x2000,
            bp: 0,
            lr: 0,
            ret_fix: None,
            bytes: &buf,
        };
        let mut dwarf = Dwarf::default();
        let gone = u32::MAX - 7;
        assert_eq!(dwarf.unwind(gone, &copy).quality, Quality::Truncated);
        assert_eq!(dwarf.unwind(gone, &copy).quality, Quality::Truncated);
        assert_eq!(dwarf.warnings.len(), 1, "{:?}", dwarf.warnings);
        assert!(dwarf.warnings[0].contains(&gone.to_string()));
    }
}
