//! The bpf(2) system call, for the few commands aya 0.14 does not make for us (a perf link
//! opened and closed on another thread, uprobe_multi links, a link's program, a map update
//! from that thread).

pub const MAP_UPDATE_ELEM: libc::c_long = 2;
pub const OBJ_GET_INFO_BY_FD: libc::c_long = 15;
pub const LINK_CREATE: libc::c_long = 28;

/// Calls bpf(2) with `cmd` and `attr` as its `union bpf_attr`, returning what it returned (a
/// new descriptor for commands that make one).
///
/// # Safety
/// `attr` must be a valid `union bpf_attr` prefix for `cmd`: every pointer in it valid for
/// what the kernel reads or writes there, for the duration of the call.
pub unsafe fn bpf<A>(cmd: libc::c_long, attr: &mut A) -> std::io::Result<i64> {
    // SAFETY: per the contract above; the size given is `attr`'s own, and the kernel may
    // write back into it (an object's info length).
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut A,
            std::mem::size_of::<A>() as u32,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}
