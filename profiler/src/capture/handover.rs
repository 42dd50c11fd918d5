//! Leaves the removal of the slow links to a helper process, so that a recording ends when
//! its report is out.
//!
//! Removing a classic tracepoint's or a uprobe's link waits for RCU grace periods; on a host
//! whose CPUs are all busy the kernel's grace-period threads wait for a CPU too, and one
//! removal took 55 s (eight spinning ranks on two CPUs, 2026-12-07). The programs behind
//! these links send nothing once the recording is stopping (`CONTROL`), so the links are
//! handed, as inherited descriptors, to `stallscope __unprobe`, which closes them, each on a
//! thread of its own so that their grace periods overlap; this process then closes its
//! copies at once, since the kernel removes a link only with its last descriptor.
//! BTF tracepoints and perf-event samplers detach without waiting and are not handed over.
use std::{
    collections::HashSet,
    os::fd::{FromRawFd as _, OwnedFd, RawFd},
    os::unix::process::CommandExt as _,
    process::{Child, Command, Stdio},
};

use aya::{Ebpf, programs::Program};

use super::kernel::bpf_call::{self, bpf};

/// The hidden subcommand that closes the descriptors it inherits.
pub const SUBCOMMAND: &str = "__unprobe";

/// The programs whose links wait for grace periods when removed: classic tracepoints and
/// uprobes (perf-event and uprobe_multi links), by kernel program ID.
pub fn slow_programs(ebpf: &Ebpf) -> HashSet<u32> {
    ebpf.programs()
        .filter(|(_, p)| matches!(p, Program::TracePoint(_) | Program::UProbe(_)))
        .filter_map(|(_, p)| p.info().ok().map(|i| i.id()))
        .collect()
}

/// The helper started, and how many links it holds.
pub struct Handed {
    pub helper: Child,
    pub links: usize,
}

/// Starts the helper with a copy of every link of `programs` this process holds; `None`
/// when there is none or the helper could not start (the links are then removed here).
pub fn hand_over(programs: &HashSet<u32>) -> Option<Handed> {
    if programs.is_empty() {
        return None;
    }
    let fds: Vec<RawFd> = link_fds()
        .into_iter()
        .filter(|&fd| link_program(fd).is_some_and(|id| programs.contains(&id)))
        .collect();
    if fds.is_empty() {
        return None;
    }
    let inherited = fds.clone();
    // The running binary, even where its file was replaced or removed since.
    let mut helper = Command::new("/proc/self/exe");
    helper
        .arg(SUBCOMMAND)
        .args(fds.iter().map(i32::to_string))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Out of the terminal's process group: a Ctrl-C meant for the next command leaves
        // it to finish.
        .process_group(0);
    // SAFETY: only fcntl, which is async-signal-safe, runs between fork and exec; the
    // descriptors are the child's copies, so this process's own stay close-on-exec and
    // nothing else it starts meanwhile inherits them.
    unsafe {
        helper.pre_exec(move || {
            for &fd in &inherited {
                let flags = libc::fcntl(fd, libc::F_GETFD);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    match helper.spawn() {
        Ok(helper) => Some(Handed {
            helper,
            links: fds.len(),
        }),
        Err(e) => {
            log::warn!("the probes are removed here: starting the helper failed: {e}");
            None
        }
    }
}

/// `stallscope __unprobe FD...`: closes each descriptor on a thread of its own.
pub fn run_helper(fds: &[RawFd]) -> anyhow::Result<i32> {
    let own: Vec<OwnedFd> = fds
        .iter()
        .filter(|&&fd| fd > 2 && is_link(fd))
        // SAFETY: a descriptor inherited for this purpose and checked to be a BPF link; it is
        // owned here alone.
        .map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect();
    std::thread::scope(|s| {
        for fd in own {
            s.spawn(move || drop(fd));
        }
    });
    Ok(0)
}

/// This process's BPF link descriptors.
fn link_fds() -> Vec<RawFd> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| is_link(fd))
        .collect()
}

fn is_link(fd: RawFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{fd}"))
        .is_ok_and(|t| t.as_os_str() == "anon_inode:bpf_link")
}

/// The program a BPF link runs (`bpf_link_info.prog_id`); `None` if `fd` is not a link.
fn link_program(fd: RawFd) -> Option<u32> {
    // struct bpf_link_info's head: type, id, prog_id.
    let mut info = [0u32; 4];
    // union bpf_attr for BPF_OBJ_GET_INFO_BY_FD: bpf_fd, info_len, info (a pointer).
    let mut attr: [u64; 2] = [
        fd as u32 as u64 | ((std::mem::size_of_val(&info) as u64) << 32),
        info.as_mut_ptr() as u64,
    ];
    // SAFETY: a bpf_attr whose buffer outlives the call and is as long as it says.
    let r = unsafe { bpf(bpf_call::OBJ_GET_INFO_BY_FD, &mut attr) };
    (r.is_ok() && info[2] != 0).then_some(info[2])
}
