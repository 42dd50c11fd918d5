//! New code in a tracked process: the dynamic linker calls `_dl_debug_state` after every
//! `dlopen` and `dlclose` (the breakpoint debuggers set, `r_debug.r_brk`), and a uprobe there
//! marks the process in `MAPS_CHANGED`, so user space reads its maps then and not on a timer.
//! A torch process maps hundreds of files, and each read of its maps costs the kernel about
//! a millisecond of formatting paths. (A `sys_enter_mmap` tracepoint would see more, but
//! any syscall tracepoint puts every syscall of every process on the host on the slow path.)
use aya_ebpf::{helpers::bpf_get_current_pid_tgid, macros::uprobe, programs::ProbeContext};

use crate::maps::{MAPS_CHANGED, slot_of};

#[uprobe]
pub fn dl_debug_state(_ctx: ProbeContext) -> u32 {
    let id = bpf_get_current_pid_tgid();
    if slot_of(id as u32) != 0 {
        let _ = MAPS_CHANGED.insert((id >> 32) as u32, 1u8, 0);
    }
    0
}
