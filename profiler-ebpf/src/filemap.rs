//! Page-cache misses: every page a tracked thread inserts into the page cache was not there,
//! so `mm_filemap_add_to_page_cache` in the inserting task's context counts its misses.
//! Aggregated in the kernel, per thread and per file, because a cold read fires this for
//! every page.
use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::tracepoint, programs::TracePointContext,
};
use profiler_common::{FileKey, FileMisses};

use crate::maps::{PAGE_CACHE_FILES, config, offset, stopped, thread_stats};

/// `filemap_order` is set to this when the running kernel's record has no `order` field.
const NO_FIELD: u32 = u32::MAX;

#[tracepoint(category = "filemap", name = "mm_filemap_add_to_page_cache")]
pub fn mm_filemap_add_to_page_cache(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(st) = thread_stats(tid) else {
        return 0;
    };
    if stopped() {
        return 0;
    }
    let order = if offset!(filemap_order) == NO_FIELD {
        0
    } else {
        // SAFETY: a checked read from the tracepoint record.
        unsafe { ctx.read_at::<u8>(offset!(filemap_order) as usize) }.unwrap_or(0) & 0x1f
    };
    let pages = 1u64 << order;
    let bytes = pages * config!(page_size);
    // SAFETY: map values stay valid for the program's run.
    unsafe {
        (*st).pc_misses += pages;
        (*st).pc_miss_bytes += bytes;
    }
    // SAFETY: checked reads from the tracepoint record.
    let key = unsafe {
        FileKey {
            tid,
            dev: ctx
                .read_at::<u32>(offset!(filemap_dev) as usize)
                .unwrap_or(0),
            ino: ctx
                .read_at::<u64>(offset!(filemap_ino) as usize)
                .unwrap_or(0),
        }
    };
    match PAGE_CACHE_FILES.get_ptr_mut(key) {
        Some(m) => {
            // SAFETY: as above. Two CPUs may race on one entry; a lost increment is
            // acceptable here, the per-thread totals above are per-thread and exact.
            unsafe {
                (*m).pages += pages;
                (*m).bytes += bytes;
            }
        }
        None => {
            let _ = PAGE_CACHE_FILES.insert(key, FileMisses { pages, bytes }, 0);
        }
    }
    0
}
