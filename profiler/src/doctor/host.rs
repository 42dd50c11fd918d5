//! What doctor reads of the host itself: the kernel log, and processes through procfs.
use std::{
    io::Read as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    time::Duration,
};

use procfs::process::{MMapPath, Process};
use profiler_core::doctor::{
    Reading,
    gpu::{Holder, HolderState},
    kernel_log::{Record, parse_record},
};

/// Every record in `/dev/kmsg` since boot, without blocking: each read() returns one record,
/// and EAGAIN says the buffer is drained.
pub fn kernel_log() -> Reading<Vec<Record>> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open("/dev/kmsg")
        .map_err(|e| {
            format!("cannot open /dev/kmsg: {e} (run as root, or sysctl kernel.dmesg_restrict=0)")
        })?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; 8192];
    loop {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if let Some(r) = parse_record(&String::from_utf8_lossy(&buf[..n])) {
                    out.push(r);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            // The oldest records were overwritten while we read: go on from the next.
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(e) => return Err(format!("reading /dev/kmsg: {e}")),
        }
    }
    Ok(out)
}

/// Now on the kernel log's clock (CLOCK_MONOTONIC), in µs.
pub fn monotonic_usec() -> u64 {
    crate::capture::clock::monotonic_ns() / 1000
}

/// The user who asked: under sudo, the one who ran sudo.
fn asking_uid() -> u32 {
    crate::sudo::invoking_uid()
        // SAFETY: getuid cannot fail.
        .unwrap_or_else(|| unsafe { libc::getuid() })
}

fn user_name(uid: u32) -> String {
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| {
            p.lines().find_map(|l| {
                let mut f = l.split(':');
                let name = f.next()?;
                (f.nth(1)? == uid.to_string()).then(|| name.to_owned())
            })
        })
        .unwrap_or_else(|| format!("uid {uid}"))
}

/// Whether `pid` is `root` or descends from it.
fn in_tree(pid: u32, root: u32) -> bool {
    let mut p = pid;
    for _ in 0..64 {
        if p == root {
            return true;
        }
        match Process::new(p as i32).and_then(|x| x.stat()) {
            Ok(s) if s.ppid > 0 => p = s.ppid as u32,
            _ => return false,
        }
    }
    false
}

/// Who a PID NVML lists as holding GPU memory is, seen from here.
pub fn holder(pid: u32, bytes: u64, target: Option<u32>) -> Holder {
    let proc = Process::new(pid as i32);
    let stat = proc.as_ref().ok().and_then(|p| p.stat().ok());
    let Some(stat) = stat else {
        return Holder {
            pid,
            bytes,
            name: String::new(),
            state: HolderState::NotVisible,
        };
    };
    let state = if stat.state == 'Z' {
        HolderState::Zombie
    } else if target.is_some_and(|t| in_tree(pid, t)) {
        HolderState::Target
    } else {
        match proc.as_ref().ok().and_then(|p| p.uid().ok()) {
            Some(uid) if uid == asking_uid() => HolderState::Yours,
            Some(uid) => HolderState::OtherUser(user_name(uid)),
            None => HolderState::NotVisible,
        }
    };
    Holder {
        pid,
        bytes,
        name: stat.comm,
        state,
    }
}

/// What doctor reads of the `--pid` process.
pub struct TargetInfo {
    pub env: std::collections::HashMap<String, String>,
    /// The libcudart it mapped, if any.
    pub cudart: Option<PathBuf>,
    pub imports_torch: bool,
    pub workers: usize,
}

pub fn target(pid: u32) -> anyhow::Result<TargetInfo> {
    let proc = Process::new(pid as i32).map_err(|e| anyhow::anyhow!("no process {pid}: {e}"))?;
    let env = proc
        .environ()
        .map_err(|e| {
            anyhow::anyhow!("cannot read the environment of process {pid}: {e} (run as root)")
        })?
        .into_iter()
        .map(|(k, v)| {
            (
                k.to_string_lossy().into_owned(),
                v.to_string_lossy().into_owned(),
            )
        })
        .collect();
    let mut cudart = None;
    let mut imports_torch = false;
    if let Ok(maps) = proc.maps() {
        for m in maps {
            if let MMapPath::Path(p) = m.pathname {
                let name = p
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                if name.starts_with("libcudart.so") && cudart.is_none() {
                    cudart = Some(p.clone());
                }
                imports_torch |= name.starts_with("libtorch");
            }
        }
    }
    let exe = proc.exe().ok();
    let workers = procfs::process::all_processes()
        .map(|all| {
            all.filter_map(Result::ok)
                .filter(|p| p.stat().is_ok_and(|s| s.ppid == pid as i32))
                .filter(|p| p.exe().ok() == exe)
                .count()
        })
        .unwrap_or(0);
    Ok(TargetInfo {
        env,
        cudart,
        imports_torch,
        workers,
    })
}

/// The `*.dist-info` folder names of the site-packages holding `lib` (a pip wheel's libcudart
/// says its full version there, not in its file name).
pub fn dist_infos(lib: &Path) -> Vec<String> {
    let Some(site) = lib.ancestors().find(|a| {
        a.file_name()
            .is_some_and(|n| n == "site-packages" || n == "dist-packages")
    }) else {
        return Vec::new();
    };
    std::fs::read_dir(site)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".dist-info"))
                .collect()
        })
        .unwrap_or_default()
}

/// Sleeps in steps until `total` has passed, calling `sample` at each, with its time offset.
pub fn sample_over(total: Duration, steps: u32, mut sample: impl FnMut(f64)) {
    let start = std::time::Instant::now();
    for i in 0..=steps {
        let due = total.mul_f64(f64::from(i) / f64::from(steps.max(1)));
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        sample(start.elapsed().as_secs_f64());
    }
}

/// This kernel's release, what it offers stallscope's programs (from its BTF, as `record`
/// reads it), and whether BTF gives the task's state field.
pub fn kernel_features()
-> Result<(String, profiler_core::kernel_support::KernelFeatures, bool), String> {
    use crate::capture::kernel::{btf::Btf, features};
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "?".into(), |s| s.trim().to_owned());
    let data = std::fs::read("/sys/kernel/btf/vmlinux").map_err(|e| {
        format!("Linux {release}: no kernel BTF at /sys/kernel/btf/vmlinux ({e}): stallscope cannot record")
    })?;
    let btf = Btf::parse(&data).map_err(|e| format!("kernel BTF: {e}"))?;
    let has_state = btf.member_offset("task_struct", "__state").is_ok()
        || btf.member_offset("task_struct", "state").is_ok();
    let features = features::masked(features::probe(&btf)).map_err(|e| e.to_string())?;
    Ok((release, features, has_state))
}
