//! Python frames for the stacks of CPython processes, read from a live process with no stop.
//!
//! User space finds each traced process's interpreter (`_PyRuntime`, its version and the
//! layout of its structures), walks its thread list for every thread's `PyThreadState`, and
//! hands both to the kernel (`PY_PROCS`, `PY_THREADS`). The kernel's sample programs then
//! walk a sampled thread's frame chain themselves, as the interpreter links it, and send
//! each frame's code object address and instruction (a `PyStack`). User space reads each code
//! object once, through `/proc/PID/mem`, for the function's name, file and line table, and
//! joins the frames into the native stack ([`merge`]).
//!
//! Reading in the kernel costs a few pointer reads per frame on a sample the kernel takes
//! anyway, where reading the whole stack from user space (py-spy's way) costs 0.3 to 0.7 ms
//! per sample and process; and the frames are those of the very instant the native stack was
//! taken, so the two join exactly.
mod code;
mod interpreter;
mod layout;
mod linetable;
mod memory;
pub mod merge;

use std::collections::{HashMap, HashSet};

use aya::maps::HashMap as BpfHashMap;
use profiler_common::{
    PY_FRAME_ENTRY, PY_FRAME_MARKS, PY_FRAME_SHIM, PY_NONE, PyFrame, PyProcess, py_entry,
};
use profiler_core::recording::record::PythonStats;

pub use code::{Code, frame_name};
pub use interpreter::{Found, Interpreter};
pub use layout::Layout;
use memory::Memory;

/// What the kernel's walk needs of a layout.
pub fn kernel_layout(l: &Layout) -> PyProcess {
    let off = |o: Option<u64>| o.map_or(PY_NONE, |o| o as u32);
    let minor = l.version.1;
    PyProcess {
        tstate_frame: l.tstate_frame as u32,
        cframe_current_frame: off(l.cframe_current_frame),
        frame_code: l.frame_code as u32,
        frame_previous: l.frame_previous as u32,
        frame_instr: l.frame_instr as u32,
        frame_owner: off(l.frame_owner),
        entry_rule: match minor {
            ..=10 => py_entry::EVERY_FRAME,
            11 => py_entry::FLAG,
            _ => py_entry::SHIM,
        },
        owner_cstack: l.owner_cstack.map_or(PY_NONE, u32::from),
    }
}

/// A traced CPython process.
struct Process {
    interp: Interpreter,
    mem: Memory,
    /// The TIDs handed to the kernel, with their thread states.
    threads: HashMap<u32, u64>,
    /// Scans in a row that could not read the thread list.
    failures: u32,
    /// The process's TIDs at the last walk of its thread list, the scans since, and the
    /// scans left to walk it on every one (after its threads changed).
    tids: HashSet<u32>,
    quiet_scans: u32,
    eager_scans: u32,
}

/// Failed scans of a process's threads before a warning (scans come every 200 ms).
const SCANS_BEFORE_WARNING: u32 = 5;

/// Scans between two walks of a process's thread list while its threads stay the same. A
/// thread's state can still move (a thread that leaves Python and comes back through
/// `PyGILState_Ensure` gets a new one), so it is walked again now and then.
const QUIET_SCANS: u32 = 5;

/// The code object at `addr` in process `p` (`pid`), read on first sight and kept, None if it
/// could not be read.
fn code_of<'a>(
    codes: &'a mut HashMap<(u32, u64), Option<Code>>,
    p: &Process,
    pid: u32,
    addr: u64,
) -> &'a Option<Code> {
    codes
        .entry((pid, addr))
        .or_insert_with(|| Code::read(&p.mem, p.interp.layout, addr, p.interp.code_type))
}

/// The Python side of a recording: the interpreters found, what the kernel was told, and
/// every code object read so far.
#[derive(Default)]
pub struct Python {
    procs: HashMap<u32, Process>,
    /// Processes whose maps showed no interpreter, or one that cannot be read: not looked at
    /// again until they exec.
    skipped: HashSet<u32>,
    /// (pid, code object address) -> the code, None if it could not be read.
    codes: HashMap<(u32, u64), Option<Code>>,
    /// (pid, code object address, instruction) -> frame name.
    names: HashMap<(u32, u64, u64), String>,
    warned: HashSet<String>,
    elves: interpreter::ElfCache,
    /// Threads handed to the kernel for processes that exec'ed or exited: taken out of its
    /// tables at the next scan (PID, TIDs).
    stale: Vec<(u32, Vec<u32>)>,
    pub stats: PythonStats,
}

impl Python {
    fn warn(&mut self, w: String) {
        if self.warned.insert(w.clone()) {
            log::warn!("{w}");
            self.stats.warnings.push(w);
        }
    }

    /// Finds `pid`'s interpreter if not yet known (when given its maps' text, `/proc/PID/maps`),
    /// then brings the kernel's view of its threads up to date.
    pub fn scan(&mut self, ebpf: &mut aya::Ebpf, pid: u32, maps: Option<&str>) {
        self.drop_stale(ebpf);
        if self.skipped.contains(&pid) {
            return;
        }
        if !self.procs.contains_key(&pid) {
            let Some(maps) = maps else {
                return;
            };
            if !self.find(ebpf, pid, maps) {
                return;
            }
        }
        let tids = interpreter::task_tids(pid);
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if tids.is_empty() {
            log::debug!("python: PID {pid} is gone");
            self.retire(pid);
            self.drop_stale(ebpf);
            return;
        }
        // A new thread gets its state a little after it starts: it is walked for on every
        // scan for a while.
        if tids != p.tids {
            p.eager_scans = QUIET_SCANS;
        }
        if maps.is_none() && p.eager_scans == 0 && p.quiet_scans < QUIET_SCANS {
            p.quiet_scans += 1;
            return;
        }
        p.eager_scans = p.eager_scans.saturating_sub(1);
        p.quiet_scans = 0;
        let states = match p.interp.threads(&p.mem, &tids) {
            Ok(states) => states,
            // Right after exec the loader maps the library's segments one at a time: the
            // data may not be there yet at the first scans.
            Err(_) if p.failures < SCANS_BEFORE_WARNING => {
                p.failures += 1;
                return;
            }
            Err(e) => {
                let path = p.interp.path.display().to_string();
                self.warn(format!(
                    "python: the threads of PID {pid} ({path}) could not be read ({e}); its stacks stay native"
                ));
                return;
            }
        };
        let Ok(mut map) = ebpf
            .map_mut("PY_THREADS")
            .ok_or(())
            .and_then(|m| BpfHashMap::<_, u32, u64>::try_from(m).map_err(drop))
        else {
            return;
        };
        p.failures = 0;
        p.tids = tids;
        let now: HashMap<u32, u64> = states.into_iter().collect();
        for (tid, tstate) in &now {
            if p.threads.get(tid) != Some(tstate) {
                let _ = map.insert(tid, tstate, 0);
            }
        }
        for tid in p.threads.keys() {
            if !now.contains_key(tid) {
                let _ = map.remove(tid);
            }
        }
        p.threads = now;
    }

    /// Stops following `pid`'s interpreter; its kernel entries go at the next scan.
    fn retire(&mut self, pid: u32) {
        if let Some(p) = self.procs.remove(&pid) {
            self.stale.push((pid, p.threads.into_keys().collect()));
        }
    }

    /// Takes the retired processes' entries out of the kernel's tables, so that they do not
    /// fill up over a long run (a DataLoader forks new workers every epoch), and a process
    /// that exec'ed a program that is not Python is not walked as if it were.
    fn drop_stale(&mut self, ebpf: &mut aya::Ebpf) {
        if self.stale.is_empty() {
            return;
        }
        let stale = std::mem::take(&mut self.stale);
        if let Some(Ok(mut threads)) = ebpf
            .map_mut("PY_THREADS")
            .map(BpfHashMap::<_, u32, u64>::try_from)
        {
            for tid in stale.iter().flat_map(|(_, tids)| tids) {
                let _ = threads.remove(tid);
            }
        }
        if let Some(Ok(mut procs)) = ebpf
            .map_mut("PY_PROCS")
            .map(BpfHashMap::<_, u32, PyProcess>::try_from)
        {
            for (pid, _) in &stale {
                if !self.procs.contains_key(pid) {
                    let _ = procs.remove(pid);
                }
            }
        }
    }

    /// Looks for an interpreter in `pid`; true if one was found and handed to the kernel.
    fn find(&mut self, ebpf: &mut aya::Ebpf, pid: u32, maps: &str) -> bool {
        let found = Interpreter::find(pid, maps, &mut self.elves);
        let interp = match found {
            Ok(Found::Python(interp)) => interp,
            Ok(Found::NotPython) => {
                self.skipped.insert(pid);
                return false;
            }
            Ok(Found::Unsupported { version, path }) => {
                self.skipped.insert(pid);
                self.warn(format!(
                    "python: PID {pid} runs CPython {}.{} ({}), whose frames this stallscope cannot read (it reads 3.8 to 3.13); its stacks stay native",
                    version.0,
                    version.1,
                    path.display()
                ));
                return false;
            }
            Err(e) => {
                self.skipped.insert(pid);
                self.warn(format!(
                    "python: the interpreter of PID {pid} could not be read ({e}); its stacks stay native"
                ));
                return false;
            }
        };
        let mem = match Memory::open(pid) {
            Ok(mem) => mem,
            Err(e) => {
                self.skipped.insert(pid);
                self.warn(format!(
                    "python: the memory of PID {pid} could not be opened ({e}); its stacks stay native"
                ));
                return false;
            }
        };
        let Some(map) = ebpf.map_mut("PY_PROCS") else {
            return false;
        };
        let Ok(mut map) = BpfHashMap::<_, u32, PyProcess>::try_from(map) else {
            return false;
        };
        if map.insert(pid, kernel_layout(interp.layout), 0).is_err() {
            self.warn(format!(
                "python: the kernel's table of Python processes is full; PID {pid}'s stacks stay native"
            ));
            return false;
        }
        let (major, minor) = interp.layout.version;
        self.stats.processes.push((pid, format!("{major}.{minor}")));
        self.procs.insert(
            pid,
            Process {
                interp,
                mem,
                threads: HashMap::new(),
                failures: 0,
                tids: HashSet::new(),
                quiet_scans: 0,
                eager_scans: 0,
            },
        );
        true
    }

    /// A process exec'ed: whatever was known of its interpreter is stale.
    pub fn forget(&mut self, pid: u32) {
        self.retire(pid);
        self.skipped.remove(&pid);
        self.codes.retain(|(p, _), _| *p != pid);
        self.names.retain(|(p, _, _), _| *p != pid);
    }

    /// The frames a probed call was made from, innermost first, up to and including the
    /// innermost one of the user's own code (not an installed package's, nor the standard
    /// library's): the line of the script that waits is that last one.
    pub fn call_site(&mut self, pid: u32, frames: &[PyFrame]) -> Option<Vec<String>> {
        let p = self.procs.get(&pid)?;
        let layout = p.interp.layout;
        let mut out = Vec::new();
        for f in frames.iter().filter(|f| f.code & PY_FRAME_SHIM == 0) {
            let addr = f.code & !PY_FRAME_MARKS;
            let code = code_of(&mut self.codes, p, pid, addr);
            let Some(code) = code else {
                continue;
            };
            out.push(frame_name(code, code.line(layout.version.1, f.instr)));
            if !code::is_library(&code.file) || out.len() >= 16 {
                break;
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// Names a sample's Python frames (innermost first, as the kernel sent them) and cuts
    /// them into the runs of [`merge::runs`]; None if the process's interpreter is unknown or
    /// none of the frames could be read.
    pub fn runs(&mut self, pid: u32, frames: &[PyFrame]) -> Option<Vec<Vec<String>>> {
        let p = self.procs.get(&pid)?;
        let layout = p.interp.layout;
        let mut named: Vec<(String, bool)> = Vec::with_capacity(frames.len());
        let mut unreadable = 0;
        for f in frames {
            let marks = f.code & PY_FRAME_MARKS;
            let addr = f.code & !PY_FRAME_MARKS;
            if marks & PY_FRAME_SHIM != 0 {
                if let Some(last) = named.last_mut() {
                    last.1 = true;
                }
                continue;
            }
            let outermost = marks & PY_FRAME_ENTRY != 0;
            if let Some(name) = self.names.get(&(pid, addr, f.instr)) {
                named.push((name.clone(), outermost));
                continue;
            }
            let code = code_of(&mut self.codes, p, pid, addr);
            let Some(code) = code else {
                unreadable += 1;
                continue;
            };
            let name = frame_name(code, code.line(layout.version.1, f.instr));
            self.names.insert((pid, addr, f.instr), name.clone());
            named.push((name, outermost));
        }
        self.stats.unreadable += unreadable;
        if named.is_empty() {
            if unreadable > 0 && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                self.warn(format!(
                    "python: PID {pid} exited before the code objects of some of its frames were read; those samples keep their native frames"
                ));
            }
            return None;
        }
        Some(merge::runs(named))
    }

    /// Counts a sample whose Python frames were merged into its stack.
    pub fn count_sample(&mut self, frames: &[PyFrame], truncated: bool) {
        self.stats.samples += 1;
        self.stats.frames += frames
            .iter()
            .filter(|f| f.code & PY_FRAME_SHIM == 0)
            .count() as u64;
        self.stats.truncated += u64::from(truncated);
    }
}
