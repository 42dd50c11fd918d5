//! Least privilege: a user given the binary with capabilities traces their own processes and
//! nobody else's, and gets private output files; every recorder, root's too, gives up the
//! capabilities it no longer needs once its programs are attached.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    os::unix::{fs::MetadataExt as _, fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::Command,
};

use common::{
    Scratch, find_tool, serial,
    spawned::Spawned,
    stallscope::{
        RECORD_TIMEOUT, assert_clean_error, assert_success, bin, parse_report, start_record,
        wait_tracing,
    },
    workload::{Workload, ready_pid, stallwork},
};

/// The capabilities our error message tells users to grant.
const GRANTED: &str = "cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep";
const CAP_DAC_OVERRIDE: u32 = 1;
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SETUID: u32 = 7;
const CAP_NET_ADMIN: u32 = 12;
const CAP_SYS_MODULE: u32 = 16;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;
const USER: &str = "stallscope-test";

/// A real system user for the test, made once per machine.
fn test_user() -> (u32, u32) {
    let id = |flag: &str| {
        let out = Command::new("id").args([flag, USER]).output().unwrap();
        out.status.success().then(|| {
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u32>()
                .unwrap()
        })
    };
    if id("-u").is_none() {
        let useradd = find_tool("useradd").expect("useradd (passwd) makes the test's user");
        let made = Command::new(useradd)
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                USER,
            ])
            .status()
            .unwrap();
        assert!(made.success(), "useradd {USER} failed: {made}");
    }
    let (uid, gid) = (id("-u").unwrap(), id("-g").unwrap());
    assert_ne!(uid, 0, "{USER} must not be root");
    (uid, gid)
}

/// The capability sets of every thread of `pid`: (CapPrm, CapEff, NoNewPrivs).
fn thread_caps(pid: u32) -> Vec<(u64, u64, bool)> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        out.push((
            u64::from_str_radix(&field("CapPrm:"), 16).unwrap(),
            u64::from_str_radix(&field("CapEff:"), 16).unwrap(),
            field("NoNewPrivs:") == "1",
        ));
    }
    assert!(!out.is_empty(), "no threads of PID {pid}");
    out
}

fn bits(caps: &[u32]) -> u64 {
    caps.iter().map(|c| 1u64 << c).sum()
}

/// Copies `from` into `dir` as `name`, executable by anyone.
fn install(from: &Path, dir: &Path, name: &str) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(from, &to).unwrap();
    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    to
}

#[test]
fn an_unprivileged_user_traces_only_their_own_processes() {
    let _serial = serial();
    let (uid, gid) = test_user();
    let setcap = find_tool("setcap").expect("setcap (libcap2-bin) grants the capabilities");
    // /tmp: every user can reach it, unlike the build tree's temporary directory.
    let dir = Scratch::under(&std::env::temp_dir(), "least-privilege");
    std::os::unix::fs::chown(&dir.path, Some(uid), Some(gid)).unwrap();
    std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o700)).unwrap();
    let stallscope = install(&bin(), &dir.path, "stallscope");
    let granted = Command::new(setcap)
        .arg(GRANTED)
        .arg(&stallscope)
        .status()
        .unwrap();
    assert!(granted.success(), "setcap {GRANTED} failed: {granted}");
    let workload = install(Path::new(stallwork()), &dir.path, "stallwork");
    let as_user = |cmd: &mut Command| {
        cmd.uid(uid)
            .gid(gid)
            .env_remove("SUDO_UID")
            .env_remove("SUDO_GID");
    };

    // The user's own process.
    let mut own = Command::new(&workload);
    own.args(["spin", "--secs", "8"]);
    as_user(&mut own);
    let own = Spawned::start(&mut own);
    let pid = own
        .wait_stdout(RECORD_TIMEOUT, |l| l.starts_with("ready pid="))
        .as_deref()
        .and_then(ready_pid)
        .unwrap_or_else(|| panic!("the user's workload never started: {}", own.stderr_so_far()));
    let file = dir.join("own.rec");
    let mut rec = Command::new(&stallscope);
    rec.args(["record", "--json", "-d", "2s", "-o"])
        .arg(&file)
        .args(["--pid", &pid.to_string()]);
    as_user(&mut rec);
    let rec = Spawned::start(&mut rec);
    wait_tracing(&rec);
    // Once attached, the recorder holds what attaching uprobes later needs, and no more.
    for (prm, eff, no_new_privs) in thread_caps(rec.pid) {
        assert_eq!(
            prm,
            bits(&[CAP_PERFMON, CAP_BPF]),
            "permitted {prm:#x}, effective {eff:#x}"
        );
        assert!(no_new_privs, "an exec could regain capabilities");
    }
    let f = rec.finish(RECORD_TIMEOUT);
    assert_success(&f, "record of the user's own process, as the user");
    let report = parse_report(&f.stdout);
    assert!(
        report["threads"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["pid"] == pid),
        "the user's process is traced: {}",
        f.stdout
    );
    let outputs: Vec<PathBuf> = std::fs::read_dir(&dir.path)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("own."))
        })
        .collect();
    assert!(
        outputs.len() >= 3,
        "the recording and its flame graphs: {outputs:?}"
    );
    for p in &outputs {
        let meta = std::fs::metadata(p).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600, "{} is not private", p.display());
        assert_eq!(
            (meta.uid(), meta.gid()),
            (uid, gid),
            "{} owner",
            p.display()
        );
    }
    let _ = own.finish(RECORD_TIMEOUT);

    // Root's process: refused before anything is attached or written.
    let refused_file = dir.join("root.rec");
    let mut rec = Command::new(&stallscope);
    rec.args(["record", "-d", "1s", "-o"])
        .arg(&refused_file)
        .args(["--pid", "1"]);
    as_user(&mut rec);
    let f = Spawned::start(&mut rec).finish(RECORD_TIMEOUT);
    assert_clean_error(&f, "record --pid 1 as an unprivileged user");
    assert!(
        f.stderr.contains("may not trace PID 1")
            && f.stderr.contains("UID 0 (root)")
            && f.stderr.contains("as ptrace does"),
        "the error names the owner rule:\n{}",
        f.describe()
    );
    assert!(
        !refused_file.exists(),
        "nothing is written for a refused PID"
    );
}

#[test]
fn root_gives_up_what_it_no_longer_needs_once_attached() {
    let _serial = serial();
    let w = Workload::start(&["spin", "--secs", "8"]);
    let dir = Scratch::new("root-caps");
    for (flags, admin) in [(&["--no-cuda-probes"][..], false), (&[][..], true)] {
        let rec = start_record(&[w.pid], "1s", &dir.join("x.rec"), flags);
        wait_tracing(&rec);
        let needed = bits(&[
            CAP_PERFMON,
            CAP_BPF,
            CAP_SYS_PTRACE,
            CAP_DAC_READ_SEARCH,
            CAP_DAC_OVERRIDE,
        ]);
        let never = bits(&[CAP_SETUID, CAP_NET_ADMIN, CAP_SYS_MODULE]);
        for (prm, eff, no_new_privs) in thread_caps(rec.pid) {
            assert_eq!(eff & needed, needed, "{flags:?}: effective {eff:#x}");
            assert_eq!(prm & never, 0, "{flags:?}: permitted {prm:#x}");
            // A uprobe perf event needs CAP_SYS_ADMIN on these kernels: kept only while the
            // CUDA probes may still attach.
            assert_eq!(
                prm & bits(&[CAP_SYS_ADMIN]) != 0,
                admin,
                "{flags:?}: {prm:#x}"
            );
            assert!(no_new_privs);
        }
        assert_success(&rec.finish(RECORD_TIMEOUT), "record as root");
    }
}
