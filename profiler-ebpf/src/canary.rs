//! A program the verifier must reject, loaded only when a test asks for it
//! (`STALLSCOPE_TEST_VERIFIER_CANARY=1`): it proves end to end that a rejection names the
//! program, prints the verifier log and leaves nothing attached. Never loaded otherwise.
use aya_ebpf::{EbpfContext as _, macros::tracepoint, programs::TracePointContext};

#[tracepoint(category = "sched", name = "sched_switch")]
pub fn verifier_canary(ctx: TracePointContext) -> u32 {
    // SAFETY: deliberately out of the context's bounds: the access the verifier refuses.
    unsafe { core::ptr::read_volatile((ctx.as_ptr() as *const u32).add(1 << 20)) }
}
