//! Puts the CUDA and NCCL uprobes on the libraries the traced processes map, once per file
//! (device and inode), through `/proc/PID/root` so that a container's own copy is probed. New
//! libraries are picked up as the maps are rescanned (PyTorch dlopens libcuda late).
//!
//! Launch probes are the exception to "attached for the whole run": a uprobe costs
//! microseconds per hit, so at tens of thousands of launches a second they are switched on
//! for a short on-period out of every period, and the counts are scaled by the time they were on.
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    os::fd::{AsFd, OwnedFd},
    os::unix::fs::MetadataExt,
    path::PathBuf,
    time::Duration,
};

use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        ProgramError, UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
    },
};
use profiler_common::cookie;
use profiler_core::{
    cuda::{APIS, CudaOp, Library, Probe},
    record::{LaunchCount, Record},
};

use super::uprobe_multi::{self, Site};
use crate::capture::clock::monotonic_ns;

pub const ENTER: &str = "cuda_enter";
pub const EXIT: &str = "cuda_exit";
/// The same programs loaded for uprobe_multi links, one per library (see `uprobe_multi`).
pub const ENTER_MULTI: &str = "cuda_enter_multi";
pub const EXIT_MULTI: &str = "cuda_exit_multi";
pub const LAUNCH: &str = "cuda_launch";

/// When launch probes are on: `on` out of every `period`.
#[derive(Clone, Copy, Debug)]
pub struct LaunchDuty {
    pub on: Duration,
    pub period: Duration,
}

/// How often the launch probes come on. Each time they go off, removing them waits for an
/// RCU-tasks grace period, whose checks interrupt the job's running threads. On the
/// launch-bound W4 job (2026-12-03, interleaved 6 s runs), each extra 1 ms on-period cost
/// about 35 ms of its throughput, where a 40 ms on-period's slowed launches cost about 30 ms
/// more: the on-periods are short (20 ms by default) and rare.
const LAUNCH_DUTY_PERIOD: Duration = Duration::from_secs(8);

impl LaunchDuty {
    /// Percent of the time the probes are on; 100 keeps them attached, 0 never attaches.
    pub fn from_percent(pct: f64) -> Self {
        let period = LAUNCH_DUTY_PERIOD;
        Self {
            on: period.mul_f64(pct.clamp(0.0, 100.0) / 100.0),
            period,
        }
    }
}

/// An attached entry or return probe: one function's perf-event uprobe, or a library's
/// uprobe_multi link for many. Dropping it removes it.
enum Link {
    // Held only to be dropped.
    #[allow(dead_code)]
    One(UProbeLink),
    #[allow(dead_code)]
    Multi(OwnedFd),
}

/// A probe and whether it is a return probe.
struct Held {
    link: Link,
    ret: bool,
}

/// Removes `links`, each on a thread of its own, the entry probes before the return probes:
/// a call whose entry is still probed after its return probe is gone would stay open.
fn remove(links: Vec<Held>) {
    let (entries, returns): (Vec<Held>, Vec<Held>) = links.into_iter().partition(|h| !h.ret);
    for side in [entries, returns] {
        std::thread::scope(|s| {
            for held in side {
                s.spawn(move || drop(held.link));
            }
        });
    }
}

pub struct CudaProbes {
    /// Files already probed (or found unprobeable), by (st_dev, st_ino).
    seen: HashSet<(u64, u64)>,
    duty_cycle: Option<super::launch_duty::DutyCycle>,
    /// Launch entry points found before the duty cycle started (file, offset, API index):
    /// handed to them when they start. `None` once they have.
    early_launches: Option<Vec<(PathBuf, u64, u64)>>,
    /// Owned, so that they can be dropped (detached) in parallel at the end.
    links: Vec<Held>,
    /// The event records' and cross-stream waits' links, kept apart to be removed when
    /// their rate gets high (see `event_guard`).
    event_links: Vec<Held>,
    event_rate: super::event_guard::EventRate,
    /// Set once they were removed: files found later get none.
    events_off: bool,
    /// By (TID, API index): the counts already reported.
    last_counts: BTreeMap<(u32, u32), u64>,
    /// The process of each thread counted: a thread stays in its process.
    tgids: HashMap<u32, u32>,
    launches: Option<BpfHashMap<MapData, u64, u64>>,
    /// Whether any launch entry point is probed: until one is, the launch counts are not
    /// read (walking the empty hash costs a scan of all its buckets on every tick).
    counting: bool,
    /// Whether the uprobe programs loaded at all.
    pub available: bool,
    /// Whether they were loaded for uprobe_multi links.
    multi: bool,
}

impl CudaProbes {
    /// The probes, none attached yet; the launch duty cycle starts with
    /// [`Self::start_launch_duty`].
    pub fn new(ebpf: &mut Ebpf, available: bool) -> Self {
        let launches = ebpf
            .take_map("LAUNCHES")
            .and_then(|m| BpfHashMap::try_from(m).ok());
        Self {
            seen: HashSet::new(),
            duty_cycle: None,
            early_launches: Some(Vec::new()),
            event_links: Vec::new(),
            event_rate: Default::default(),
            events_off: false,
            links: Vec::new(),
            last_counts: BTreeMap::new(),
            tgids: HashMap::new(),
            launches,
            counting: false,
            available,
            multi: program(ebpf, ENTER_MULTI).is_ok_and(|p| p.fd().is_ok()),
        }
    }

    /// Starts switching the launch probes on and off, on a thread of its own.
    pub fn start_launch_duty(&mut self, ebpf: &mut Ebpf, duty: LaunchDuty) {
        let available = self.available;
        self.duty_cycle = if available && !duty.on.is_zero() {
            let fd = program(ebpf, LAUNCH)
                .and_then(|p| p.fd().and_then(|fd| fd.try_clone().map_err(Into::into)))
                .map_err(|e| e.to_string())
                .and_then(|fd| {
                    let fd: OwnedFd = fd.as_fd().try_clone_to_owned().map_err(|e| e.to_string())?;
                    let control = match ebpf.map("CONTROL") {
                        Some(aya::maps::Map::Array(data)) => data
                            .fd()
                            .as_fd()
                            .try_clone_to_owned()
                            .map_err(|e| e.to_string())?,
                        _ => return Err("the CONTROL map is missing".to_string()),
                    };
                    super::launch_duty::DutyCycle::start(fd, control, duty.on, duty.period)
                        .map_err(|e| e.to_string())
                });
            match fd {
                Ok(w) => Some(w),
                Err(e) => {
                    eprintln!("stallscope: warning: kernel launches not counted: {e}");
                    None
                }
            }
        } else {
            None
        };
        for (path, offset, api) in self.early_launches.take().unwrap_or_default() {
            if let Some(w) = &self.duty_cycle {
                w.add(path, offset, api);
                self.counting = true;
            }
        }
    }

    /// Probes the CUDA/NCCL libraries `pid` maps that are not probed yet; returns a record for
    /// each newly probed file, and warns about missing functions.
    /// `maps` is the process's /proc/PID/maps, read once by the caller.
    pub fn scan(&mut self, ebpf: &mut Ebpf, pid: u32, maps: &str) -> Vec<Record> {
        if !self.available {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut paths: Vec<&str> = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|p| p.starts_with('/'))
            .collect();
        paths.dedup();
        for path in paths {
            let Some(library) = path.rsplit('/').next().and_then(Library::of_file) else {
                continue;
            };
            let in_ns = PathBuf::from(format!("/proc/{pid}/root{path}"));
            let Ok(meta) = std::fs::metadata(&in_ns) else {
                continue;
            };
            if !self.seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            out.push(self.attach_file(ebpf, pid, path, &in_ns, library));
        }
        out
    }

    fn attach_file(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        path: &str,
        in_ns: &std::path::Path,
        library: Library,
    ) -> Record {
        let mut attached = Vec::new();
        let mut missing = Vec::new();
        let symbols = match super::elf::Symbols::read(in_ns) {
            Ok(s) => s,
            Err(e) => {
                eprintln!(
                    "stallscope: warning: {} ({path}, PID {pid}) not probed: {e}",
                    library.name()
                );
                return Record::CudaProbes {
                    ts_ns: monotonic_ns(),
                    pid,
                    path: path.to_string(),
                    library,
                    attached,
                    missing: vec![("*".into(), e)],
                };
            }
        };
        // With uprobe_multi: the sites of the library's one link (and the event APIs' own),
        // by API name, attached after the loop.
        let mut sites: [Vec<(&str, Site)>; 2] = Default::default();
        for (i, api) in APIS.iter().enumerate() {
            if api.library != library {
                continue;
            }
            let Some(offset) = symbols.offset(api.name) else {
                if !api.optional {
                    missing.push((api.name.to_string(), "no such symbol".to_string()));
                }
                continue;
            };
            let result = match api.probe {
                Probe::Counted => match (&self.duty_cycle, &mut self.early_launches) {
                    (Some(w), _) => {
                        w.add(in_ns.to_path_buf(), offset, i as u64);
                        self.counting = true;
                        Ok(())
                    }
                    (None, Some(early)) => {
                        early.push((in_ns.to_path_buf(), offset, i as u64));
                        Ok(())
                    }
                    (None, None) => continue,
                },
                Probe::Timed | Probe::TimedOutPtr => {
                    let mut flags = if api.probe == Probe::TimedOutPtr {
                        cookie::OUT_PTR
                    } else {
                        0
                    };
                    if api.id_by_reference() {
                        flags |= cookie::ARG2_BY_REF;
                    }
                    let c = i as u64 | flags;
                    let events = api.is_event_dependency();
                    if events && self.events_off {
                        continue;
                    }
                    if self.multi {
                        sites[usize::from(events)].push((api.name, Site { offset, cookie: c }));
                        continue;
                    }
                    let links = if events {
                        &mut self.event_links
                    } else {
                        &mut self.links
                    };
                    attach(ebpf, ENTER, in_ns, offset, c)
                        .and_then(|l| {
                            links.push(Held {
                                link: Link::One(l),
                                ret: false,
                            });
                            attach(ebpf, EXIT, in_ns, offset, c)
                        })
                        .map(|l| {
                            links.push(Held {
                                link: Link::One(l),
                                ret: true,
                            })
                        })
                }
            };
            match result {
                Ok(()) => attached.push(api.name.to_string()),
                Err(e) => missing.push((api.name.to_string(), e.to_string())),
            }
        }
        for (events, sites) in sites.into_iter().enumerate() {
            if sites.is_empty() {
                continue;
            }
            let links = if events == 1 {
                &mut self.event_links
            } else {
                &mut self.links
            };
            let all: Vec<Site> = sites.iter().map(|(_, s)| *s).collect();
            // One link for all; where the kernel refuses one of the sites, a link per
            // function, so that only that function goes unprobed.
            let singles: Vec<(&str, Site)> = match attach_multi(ebpf, in_ns, &all) {
                Ok(pair) => {
                    links.extend(multi_held(pair));
                    attached.extend(sites.iter().map(|(name, _)| name.to_string()));
                    Vec::new()
                }
                Err(_) => sites,
            };
            for (name, site) in singles {
                match attach_multi(ebpf, in_ns, &[site]) {
                    Ok(pair) => {
                        links.extend(multi_held(pair));
                        attached.push(name.to_string());
                    }
                    Err(e) => missing.push((name.to_string(), e.to_string())),
                }
            }
        }
        for (name, why) in &missing {
            eprintln!(
                "stallscope: warning: {} ({path}, PID {pid}): `{name}` not probed: {why}",
                library.name()
            );
        }
        Record::CudaProbes {
            ts_ns: monotonic_ns(),
            pid,
            path: path.to_string(),
            library,
            attached,
            missing,
        }
    }

    /// The launch counts gathered since the last call, and how long the probes were on.
    pub fn tick(&mut self) -> Option<Record> {
        let probed_ns = self.duty_cycle.as_ref()?.take_probed_ns();
        let map = self.launches.as_ref().filter(|_| self.counting);
        let mut counts = Vec::new();
        for entry in map.iter().flat_map(|m| m.iter()) {
            let Ok((key, total)) = entry else { continue };
            let (tid, api) = ((key >> 32) as u32, key as u32);
            let last = self.last_counts.insert((tid, api), total).unwrap_or(0);
            if total > last {
                counts.push(LaunchCount {
                    tid,
                    pid: match self.tgids.get(&tid) {
                        Some(&pid) => pid,
                        None => {
                            let pid = crate::capture::proc::target::tgid(tid).unwrap_or(0);
                            if pid != 0 {
                                self.tgids.insert(tid, pid);
                            }
                            pid
                        }
                    },
                    launches: total - last,
                    api: APIS
                        .get(api as usize)
                        .map_or_else(|| format!("#{api}"), |a| a.name.to_string()),
                });
            }
        }
        if probed_ns == 0 && counts.is_empty() {
            return None;
        }
        counts.sort_by_key(|c| c.tid);
        Some(Record::Launches {
            ts_ns: monotonic_ns(),
            probed_ns,
            counts,
        })
    }

    /// Counts the event records and cross-stream waits among the session's records.
    pub fn note(&mut self, record: &Record) {
        if let Record::CudaCall(c) = record
            && matches!(
                c.op,
                CudaOp::EventRecord { .. } | CudaOp::StreamWaitEvent { .. }
            )
        {
            self.event_rate.note(c.pid);
        }
    }

    /// Removes the event probes once a process calls them too often, and says so; the
    /// removal (a grace period per probe) runs on a thread of its own.
    pub fn guard_events(&mut self, now_ns: u64) -> Option<Record> {
        let (pid, rate) = self.event_rate.over(now_ns)?;
        if self.events_off {
            return None;
        }
        self.events_off = true;
        let links = std::mem::take(&mut self.event_links);
        let _ = std::thread::Builder::new()
            .name("stallscope-unprobe".into())
            .spawn(move || remove(links));
        let reason = format!(
            "PID {pid} recorded or waited for CUDA events {rate:.0} times a second (over {:.0}): \
             their probes were removed to spare the job; from here on a sync is assumed to \
             wait for the collectives on the process's other streams",
            super::event_guard::MAX_PER_SEC
        );
        eprintln!("stallscope: note: {reason}");
        Some(Record::Unavailable {
            signal: "cuda-events".into(),
            reason,
        })
    }

    /// Whether the probes are uprobe_multi links, removed with a grace period per link.
    pub fn multi(&self) -> bool {
        self.multi
    }

    /// Silences every probe at once; they are removed later by [`Self::release`].
    pub fn silence(&mut self, ebpf: &mut Ebpf) {
        if let Some(map) = ebpf.map_mut("CONTROL")
            && let Ok(mut control) = aya::maps::Array::<_, u32>::try_from(map)
            && let Err(e) = control.set(profiler_common::control::STOPPED, 1, 0)
        {
            log::warn!("silencing the CUDA probes: {e}");
        }
    }

    /// Removes the probes on a thread of its own, each link on a thread of its own so that
    /// their grace periods overlap where the kernel allows it (a perf-event uprobe waits for
    /// its own under a kernel-wide lock: about 80 ms each here, seconds for a few dozen, a
    /// minute on a busy host); join the handle before exiting.
    pub fn release(&mut self) -> Option<std::thread::JoinHandle<()>> {
        let mut links = std::mem::take(&mut self.links);
        links.append(&mut self.event_links);
        let duty_cycle = self.duty_cycle.take();
        if links.is_empty() && duty_cycle.is_none() {
            return None;
        }
        std::thread::Builder::new()
            .name("stallscope-unprobe".into())
            .spawn(move || {
                std::thread::scope(|s| {
                    s.spawn(move || drop(duty_cycle));
                    s.spawn(move || remove(links));
                });
            })
            .ok()
    }

    /// Ends the launch duty cycle and reports the rest.
    pub fn finish(&mut self) -> Option<Record> {
        let probed_ns = self.duty_cycle.as_ref()?.end();
        let record = self.tick();
        match record {
            Some(Record::Launches {
                ts_ns,
                probed_ns: p,
                counts,
            }) => Some(Record::Launches {
                ts_ns,
                probed_ns: p + probed_ns,
                counts,
            }),
            None if probed_ns > 0 => Some(Record::Launches {
                ts_ns: monotonic_ns(),
                probed_ns,
                counts: Vec::new(),
            }),
            other => other,
        }
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe, ProgramError> {
    ebpf.program_mut(name)
        .ok_or(ProgramError::NotLoaded)?
        .try_into()
}

fn multi_held([enter, exit]: [OwnedFd; 2]) -> [Held; 2] {
    [
        Held {
            link: Link::Multi(enter),
            ret: false,
        },
        Held {
            link: Link::Multi(exit),
            ret: true,
        },
    ]
}

/// The entry and return links of a library's sites.
fn attach_multi(
    ebpf: &mut Ebpf,
    path: &std::path::Path,
    sites: &[Site],
) -> Result<[OwnedFd; 2], ProgramError> {
    let mut link = |prog: &str, ret: bool| -> Result<OwnedFd, ProgramError> {
        let fd = program(ebpf, prog)?.fd()?;
        uprobe_multi::attach(fd.as_fd(), path, sites, ret).map_err(|io_error| {
            ProgramError::SyscallError(aya::sys::SyscallError {
                call: "BPF_LINK_CREATE (uprobe_multi)",
                io_error,
            })
        })
    };
    // The return probes first: an entry without its return would leave a call open.
    let exit = link(EXIT_MULTI, true)?;
    Ok([link(ENTER_MULTI, false)?, exit])
}

fn attach(
    ebpf: &mut Ebpf,
    prog: &str,
    path: &std::path::Path,
    offset: u64,
    cookie: u64,
) -> Result<UProbeLink, ProgramError> {
    let p = program(ebpf, prog)?;
    let id = p.attach(
        UProbeAttachPoint {
            location: UProbeAttachLocation::AbsoluteOffset(offset),
            cookie: Some(cookie),
        },
        path,
        UProbeScope::AllProcesses,
    )?;
    p.take_link(id)
}
