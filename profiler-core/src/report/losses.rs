//! What a lost record kind takes from the report: the time split by thread state is exact
//! whatever is lost (the kernel keeps it per thread, read at every tick), but each kind of
//! record is the evidence of some causes, and a loss weakens those.

/// What losing records of `kind` (the kernel's name, as in the JSON report's `events`)
/// weakens; `None` for a kind the report does not know.
pub fn weakens(kind: &str) -> Option<&'static str> {
    Some(match kind {
        "cpu_sample" => {
            "the on-CPU flame graph and the stacks of CPU-bound causes (dataloader_cpu, \
             host_compute, cpu_contention)"
        }
        "offcpu_sample" | "offcpu_end" | "user_stack" | "py_stack" => {
            "the off-CPU stacks: the evidence of disk, lock_wait, gil_contention and no_work, \
             and what the feeder waited on"
        }
        "block_io" => "disk: the IO latencies and bytes behind it",
        "cuda_call" => {
            "the CUDA and NCCL calls: launch_overhead, pinned_memory_copy, sync waits, \
             nccl_wait and the ranks"
        }
        "thread_new" | "exec" | "thread_exit" => {
            "the accounts of threads and processes that started or ended during the recording"
        }
        "thread_untracked" => "threads past --max-threads, not traced at all",
        "woken" => "who woke the feeder: the holder named for gil_contention and lock_wait",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_kind_that_can_be_lost_is_explained() {
        use profiler_common::kind;
        for name in kind::NAMES.iter().skip(1) {
            if name.ends_with(kind::THINNED_SUFFIX) {
                assert_eq!(weakens(name), None, "{name} is thinned, never lost");
            } else {
                assert!(weakens(name).is_some(), "{name}");
            }
        }
        assert_eq!(kind::THINNED_SUFFIX, crate::analysis::fold::THINNED_SUFFIX);
        assert!(weakens("block_io").unwrap().contains("disk"));
        assert_eq!(weakens("sched"), None);
    }
}
