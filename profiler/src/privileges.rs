//! What this process may do, and what it gives up: the capabilities checked before touching
//! the kernel (every missing one named), whose processes a caller other than root may trace
//! (its own, as ptrace decides), and the capabilities dropped once the programs are attached.
use std::path::Path;

use caps::{CapSet, Capability, CapsHashSet};

const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Names of the capabilities missing from the effective set `cap_eff`. CAP_SYS_ADMIN stands
/// in for CAP_BPF and CAP_PERFMON, as on kernels before 5.8.
pub fn missing(cap_eff: u64) -> Vec<&'static str> {
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    let admin = has(CAP_SYS_ADMIN);
    let mut out = Vec::new();
    if !has(CAP_BPF) && !admin {
        out.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) && !admin {
        out.push("CAP_PERFMON");
    }
    if !has(CAP_SYS_PTRACE) {
        out.push("CAP_SYS_PTRACE");
    }
    if !has(CAP_DAC_READ_SEARCH) {
        out.push("CAP_DAC_READ_SEARCH");
    }
    out
}

fn cap_eff() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| anyhow::anyhow!("no CapEff line in /proc/self/status"))?;
    Ok(u64::from_str_radix(hex.trim(), 16)?)
}

pub fn check() -> anyhow::Result<()> {
    let missing = missing(cap_eff()?);
    if missing.is_empty() {
        return Ok(());
    }
    let args: Vec<String> = std::env::args().collect();
    anyhow::bail!(
        "insufficient privileges: missing {}.\n{}",
        missing.join(", "),
        how_to_rerun(std::env::current_exe().ok().as_deref(), &args)
    )
}

/// How to run the same command again with the privileges. sudo resets PATH to its
/// secure_path, so a stallscope that the shell found in a virtualenv or ~/.local/bin (where pip
/// puts it) is "command not found" under sudo: name the binary's absolute path, or keep PATH,
/// as py-spy's message does.
fn how_to_rerun(exe: Option<&Path>, args: &[String]) -> String {
    let quoted = |a: &str| shlex::try_quote(a).map_or_else(|_| a.to_owned(), |q| q.into_owned());
    let exe = exe.map_or_else(
        || args.first().map_or("stallscope".into(), |a| quoted(a)),
        |e| quoted(&e.to_string_lossy()),
    );
    let rest: String = args
        .iter()
        .skip(1)
        .map(|a| format!(" {}", quoted(a)))
        .collect();
    format!(
        "Run it as root, naming the binary (sudo resets PATH, so one installed with pip is not \
         found by name):\n  \
         sudo {exe}{rest}\n\
         or keep your PATH:\n  \
         sudo env \"PATH=$PATH\" stallscope{rest}\n\
         or grant the capabilities to the binary once:\n  \
         sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep {exe}\n\
         (then it traces only the processes of the user who runs it)"
    )
}

/// The real UID of the caller: the user behind the capabilities a binary was given.
pub fn caller_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

/// A process's real, effective and saved UIDs, from /proc/PID/status.
pub fn process_uids(pid: u32) -> Option<[u32; 3]> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    uids_from_status(&status)
}

fn uids_from_status(status: &str) -> Option<[u32; 3]> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut ids = line.split_whitespace().map(|v| v.parse::<u32>().ok());
    Some([ids.next()??, ids.next()??, ids.next()??])
}

/// Why `caller` may not trace a process with `uids` (real, effective, saved), or `None` when
/// it may. Root traces anything; anyone else only processes whose every UID is theirs, as
/// ptrace allows without CAP_SYS_PTRACE: a binary given the capabilities must not become a
/// way into other users' (or root's) processes.
pub fn refusal(caller: u32, uids: [u32; 3]) -> Option<String> {
    if caller == 0 || uids.iter().all(|&u| u == caller) {
        return None;
    }
    let owner = if uids[0] == 0 {
        "UID 0 (root)".to_string()
    } else {
        format!("UID {}", uids[0])
    };
    Some(format!(
        "it belongs to {owner} (real/effective/saved UIDs {}/{}/{}), and stallscope run by UID \
         {caller} traces only processes whose real, effective and saved UIDs are its caller's, \
         as ptrace does; run it as root (sudo) to trace other users' processes",
        uids[0], uids[1], uids[2]
    ))
}

/// Splits `pids` into the ones `caller` may trace and the refused ones with the reason. A
/// process that has exited is left to the caller's own "no such process" check.
pub fn split_traceable(caller: u32, pids: &[u32]) -> (Vec<u32>, Vec<(u32, String)>) {
    if caller == 0 {
        return (pids.to_vec(), Vec::new());
    }
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    for &pid in pids {
        match process_uids(pid).and_then(|uids| refusal(caller, uids)) {
            Some(why) => refused.push((pid, why)),
            None => ok.push(pid),
        }
    }
    (ok, refused)
}

/// Gives up every capability the rest of the recording does not need, once the programs are
/// attached and the kernel's symbols read: later work reads maps and the ring buffer, attaches
/// the loaded programs to uprobes (see [`kept`]), and, for root, reads other users' /proc
/// entries and writes and hands files to the sudo user. No exec can win them back. Run on the only thread: capability
/// sets belong to threads, and the ones started later inherit these. Returns the capabilities
/// kept.
pub fn drop_after_attach(cuda_probes: bool) -> anyhow::Result<CapsHashSet> {
    let threads = std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count());
    anyhow::ensure!(
        threads <= 1,
        "dropping capabilities with {threads} threads running: the others would keep theirs"
    );
    let keep = kept(
        caller_uid() == 0,
        crate::sudo::invoking_user().is_some(),
        cuda_probes,
        caps::runtime::thread_all_supported(),
    );
    let permitted = caps::read(None, CapSet::Permitted)?;
    let keep: CapsHashSet = keep.intersection(&permitted).copied().collect();
    // Root can otherwise regain everything by exec; no exec is needed from here on. The
    // bounding set needs CAP_SETPCAP to change, which only root has: a file-capability binary
    // has its bounding set from the invoking user already.
    // SAFETY: prctl with PR_SET_NO_NEW_PRIVS takes integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        anyhow::bail!("PR_SET_NO_NEW_PRIVS: {}", std::io::Error::last_os_error());
    }
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP)? {
        for cap in caps::all() {
            if !keep.contains(&cap) && caps::runtime::thread_all_supported().contains(&cap) {
                caps::drop(None, CapSet::Bounding, cap)?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient)?;
    caps::set(None, CapSet::Inheritable, &CapsHashSet::new())?;
    caps::set(None, CapSet::Effective, &keep)?;
    caps::set(None, CapSet::Permitted, &keep)?;
    Ok(keep)
}

/// What the recording still needs after attach: CAP_BPF and CAP_PERFMON to attach the loaded
/// programs to uprobes later (a library dlopened mid-run, the launch probes' duty cycle: linking a program
/// to a perf event is refused without CAP_BPF), and, while the CUDA probes are on, CAP_SYS_ADMIN:
/// the kernels here refuse a uprobe perf event without it, CAP_PERFMON or not. Before 5.8,
/// CAP_SYS_ADMIN stood in for CAP_BPF and CAP_PERFMON.
fn kept(root: bool, sudo: bool, cuda_probes: bool, supported: CapsHashSet) -> CapsHashSet {
    let mut keep = CapsHashSet::from([Capability::CAP_PERFMON, Capability::CAP_BPF]);
    if cuda_probes || !supported.contains(&Capability::CAP_PERFMON) {
        keep.insert(Capability::CAP_SYS_ADMIN);
    }
    if root {
        // Other users' /proc/PID/maps, environ and root/ (symbols, CUDA libraries), and the
        // flame graphs written where the user asked, say their own home under sudo.
        keep.extend([
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_DAC_READ_SEARCH,
            Capability::CAP_DAC_OVERRIDE,
        ]);
        if sudo {
            keep.insert(Capability::CAP_CHOWN);
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_missing() {
        assert_eq!(
            missing(0),
            [
                "CAP_BPF",
                "CAP_PERFMON",
                "CAP_SYS_PTRACE",
                "CAP_DAC_READ_SEARCH"
            ]
        );
        let all = (1 << CAP_BPF)
            | (1 << CAP_PERFMON)
            | (1 << CAP_SYS_PTRACE)
            | (1 << CAP_DAC_READ_SEARCH);
        assert!(missing(all).is_empty());
        let admin = (1 << CAP_SYS_ADMIN) | (1 << CAP_SYS_PTRACE) | (1 << CAP_DAC_READ_SEARCH);
        assert!(missing(admin).is_empty());
        assert_eq!(
            missing(1 << CAP_BPF),
            ["CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"]
        );
    }

    #[test]
    fn only_root_traces_other_users() {
        assert_eq!(refusal(0, [1000, 1000, 1000]), None);
        assert_eq!(refusal(1000, [1000, 1000, 1000]), None);
        let root = refusal(1000, [0, 0, 0]).expect("root's process is refused");
        assert!(
            root.contains("UID 0 (root)") && root.contains("as ptrace does"),
            "{root}"
        );
        // A setuid program started by the user runs with another effective UID.
        assert!(refusal(1000, [1000, 0, 0]).is_some());
        assert!(
            refusal(1000, [1001, 1001, 1001])
                .unwrap()
                .contains("UID 1001")
        );
    }

    #[test]
    fn uids_come_from_the_status_file() {
        let status = "Name:\tpython\nUid:\t1000\t1000\t1000\t1000\nGid:\t100\t100\t100\t100\n";
        assert_eq!(uids_from_status(status), Some([1000, 1000, 1000]));
        assert_eq!(uids_from_status("Name:\tx\n"), None);
        let me = process_uids(std::process::id()).expect("our own status");
        assert_eq!(me[0], caller_uid());
    }

    #[test]
    fn a_user_keeps_what_attaching_needs_root_what_other_users_need() {
        let all = caps::all();
        let attach = CapsHashSet::from([Capability::CAP_PERFMON, Capability::CAP_BPF]);
        assert_eq!(kept(false, false, false, all.clone()), attach);
        let probes = kept(false, false, true, all.clone());
        assert_eq!(probes.len(), 3);
        assert!(probes.contains(&Capability::CAP_SYS_ADMIN));
        let root = kept(true, true, false, all.clone());
        assert!(
            root.contains(&Capability::CAP_SYS_PTRACE) && root.contains(&Capability::CAP_CHOWN)
        );
        assert!(
            !root.contains(&Capability::CAP_SYS_ADMIN) && !root.contains(&Capability::CAP_SETUID)
        );
        let mut pre_5_8 = all;
        pre_5_8.remove(&Capability::CAP_PERFMON);
        pre_5_8.remove(&Capability::CAP_BPF);
        assert!(kept(false, false, false, pre_5_8).contains(&Capability::CAP_SYS_ADMIN));
    }
    #[test]
    fn the_rerun_hint_names_the_binary_and_keeps_path_for_a_virtualenv() {
        let args: Vec<String> = ["stallscope", "record", "--pid", "42", "-o", "my run.rec"]
            .map(String::from)
            .into();
        let hint = how_to_rerun(Some(Path::new("/home/u/venv/bin/stallscope")), &args);
        assert!(
            hint.contains("sudo /home/u/venv/bin/stallscope record --pid 42 -o 'my run.rec'\n"),
            "{hint}"
        );
        assert!(
            hint.contains("sudo env \"PATH=$PATH\" stallscope record --pid 42 -o 'my run.rec'\n"),
            "{hint}"
        );
        assert!(hint.contains("+ep /home/u/venv/bin/stallscope\n"), "{hint}");
    }
}
