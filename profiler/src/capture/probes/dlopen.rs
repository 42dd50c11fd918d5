//! A uprobe on the dynamic linker's `_dl_debug_state`, which glibc and musl call after every
//! `dlopen` and `dlclose` for debuggers: the kernel then marks the process in `MAPS_CHANGED`
//! (profiler-ebpf's dlopen.rs), and the session reads its maps at once instead of on a
//! short timer. A process whose loader is not probed (a static binary, a loader without the
//! symbol) keeps the timer. Like the CUDA probes, it is one probe per file, for every process
//! that maps it: one that is not traced pays a trap per `dlopen`, which is rare.
use std::{collections::HashMap, os::unix::fs::MetadataExt as _, path::PathBuf};

use aya::{
    Ebpf,
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope},
    },
};

/// The eBPF program, loaded with the others.
pub const PROGRAM: &str = "dl_debug_state";
const SYMBOL: &str = "_dl_debug_state";

/// Whether `name` is a dynamic linker's file name: `ld-linux-x86-64.so.2`,
/// `ld-linux-aarch64.so.1`, `ld-musl-x86_64.so.1`, `ld-musl-aarch64.so.1`.
fn is_loader(name: &str) -> bool {
    name.starts_with("ld-linux") || name.starts_with("ld-musl") || name == "ld.so"
}

#[derive(Default)]
pub struct DlopenWatch {
    /// Loader files already looked at, by (st_dev, st_ino): probed or not.
    files: HashMap<(u64, u64), bool>,
    links: Vec<UProbeLink>,
}

impl DlopenWatch {
    /// Probes the loader `pid` maps (from its `maps`), once per file; true if it is probed.
    /// Asked at every read of the maps: after an exec the loader may be another one, or none.
    pub fn scan(&mut self, ebpf: &mut Ebpf, pid: u32, maps: &str) -> bool {
        let Some(path) = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.starts_with('/') && p.rsplit('/').next().is_some_and(is_loader))
        else {
            return false;
        };
        let in_ns = PathBuf::from(format!("/proc/{pid}/root{path}"));
        let Ok(meta) = std::fs::metadata(&in_ns) else {
            return false;
        };
        let key = (meta.dev(), meta.ino());
        if let Some(&probed) = self.files.get(&key) {
            return probed;
        }
        let probed = match self.attach(ebpf, &in_ns) {
            Ok(link) => {
                self.links.push(link);
                true
            }
            Err(e) => {
                log::info!(
                    "{path} (PID {pid}) not probed at {SYMBOL}: {e}; its maps are read on a timer"
                );
                false
            }
        };
        self.files.insert(key, probed);
        probed
    }

    fn attach(&self, ebpf: &mut Ebpf, path: &std::path::Path) -> anyhow::Result<UProbeLink> {
        let offset = super::elf::Symbols::read(path)
            .map_err(anyhow::Error::msg)?
            .offset(SYMBOL)
            .ok_or_else(|| anyhow::anyhow!("no such symbol"))?;
        let prog: &mut UProbe = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| anyhow::anyhow!("eBPF program `{PROGRAM}` missing"))?
            .try_into()?;
        let id = prog.attach(
            UProbeAttachPoint {
                location: UProbeAttachLocation::AbsoluteOffset(offset),
                cookie: None,
            },
            path,
            UProbeScope::AllProcesses,
        )?;
        Ok(prog.take_link(id)?)
    }

    /// The probes, for removal with the others (each waits for a grace period).
    pub fn release(&mut self) -> Vec<UProbeLink> {
        std::mem::take(&mut self.links)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loaders_are_known_by_name() {
        assert!(is_loader("ld-linux-x86-64.so.2"));
        assert!(is_loader("ld-musl-x86_64.so.1"));
        assert!(is_loader("ld-linux-aarch64.so.1"));
        assert!(is_loader("ld-musl-aarch64.so.1"));
        assert!(!is_loader("libld.so"));
        assert!(!is_loader("ldconfig"));
    }

    #[test]
    fn this_systems_loader_has_the_symbol() {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let path = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .find(|p| p.rsplit('/').next().is_some_and(is_loader))
            .expect("this test binary is dynamically linked");
        let symbols = super::super::elf::Symbols::read(std::path::Path::new(path)).unwrap();
        assert!(symbols.offset(SYMBOL).is_some(), "{path} has no {SYMBOL}");
    }
}
