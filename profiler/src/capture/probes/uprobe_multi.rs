//! `uprobe_multi` links (Linux 6.6): one BPF link puts a program on many offsets of one file,
//! for every process. Closing it removes all of its uprobes after one grace period, where a
//! perf-event uprobe waits for its own grace period under a kernel-wide lock: with the 44
//! CUDA and NCCL probes of a job, removal took from seconds to over a minute on a host whose
//! CPUs were busy (2026-12-07, eight spinning ranks on two CPUs).
//!
//! aya 0.14 loads a program for such a link (`UProbe::load_multi`, patched in, see
//! `third_party/aya`) but does not create the link, so that is one `BPF_LINK_CREATE` here.
use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd},
    os::unix::ffi::OsStrExt,
    path::Path,
};

use crate::capture::kernel::bpf_call::{self, bpf};

const BPF_TRACE_UPROBE_MULTI: u64 = 48;
const BPF_F_UPROBE_MULTI_RETURN: u64 = 1;

/// One probe of a link: the offset in the file and the cookie the program reads there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Site {
    pub offset: u64,
    pub cookie: u64,
}

/// Puts `prog` (loaded with `load_multi`) on every site of `path`, at entry or, with
/// `ret`, at return; the link lives as long as the descriptor.
pub fn attach(prog: BorrowedFd, path: &Path, sites: &[Site], ret: bool) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    let offsets: Vec<u64> = sites.iter().map(|s| s.offset).collect();
    let cookies: Vec<u64> = sites.iter().map(|s| s.cookie).collect();
    link_create(prog, &path, &offsets, Some(&cookies), ret)
}

/// Whether this kernel makes uprobe_multi links for `prog`: asked, as libbpf and cilium/ebpf
/// do, with a link on `/`, which a kernel that knows the link refuses as a bad file
/// (`EBADF`) and one that does not refuses as an unknown attach type (`EINVAL`).
pub fn supported(prog: BorrowedFd) -> bool {
    let root = c"/";
    match link_create(prog, root, &[0], None, false) {
        Ok(_) => false,
        Err(e) => e.raw_os_error() == Some(libc::EBADF),
    }
}

fn link_create(
    prog: BorrowedFd,
    path: &std::ffi::CStr,
    offsets: &[u64],
    cookies: Option<&[u64]>,
    ret: bool,
) -> io::Result<OwnedFd> {
    if offsets.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no offsets"));
    }
    // union bpf_attr for BPF_LINK_CREATE: prog_fd, target_fd (u32 each), attach_type, flags
    // (u32 each), then uprobe_multi: path, offsets, ref_ctr_offsets, cookies (pointers), cnt,
    // flags, pid (u32 each).
    let mut attr = [0u64; 8];
    attr[0] = prog.as_raw_fd() as u64;
    attr[1] = BPF_TRACE_UPROBE_MULTI;
    attr[2] = path.as_ptr() as u64;
    attr[3] = offsets.as_ptr() as u64;
    attr[5] = cookies.map_or(0, |c| c.as_ptr() as u64);
    attr[6] = offsets.len() as u64
        | if ret {
            BPF_F_UPROBE_MULTI_RETURN << 32
        } else {
            0
        };
    // SAFETY: a bpf_attr whose pointers outlive the call; the kernel copies the arrays in.
    let fd = unsafe { bpf(bpf_call::LINK_CREATE, &mut attr) }?;
    // SAFETY: a fresh descriptor the kernel just returned.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
