//! What a wake-up ran in, from the kernel stack where `sched_waking` caught it: the waker's
//! own call (a futex wake, a write to a pipe or a socket), or an interrupt or a timer that
//! only interrupted whichever task was current.
use profiler_common::{MAX_KERNEL_FRAMES, Woken};

use super::stacks::{Namer, frames};

/// The context of a wake-up whose kernel stack (named, root first) is `stack`: `timer`,
/// `network receive`, `block IO completion`, `interrupt`, or `task`.
pub fn context(stack: &[String]) -> &'static str {
    let has = |names: &[&str]| stack.iter().any(|f| names.iter().any(|n| f.starts_with(n)));
    // The deepest cause wins: a timer's wake-up runs inside an interrupt, and a loopback
    // packet's receive inside the sender's system call.
    if has(&[
        "hrtimer_wakeup",
        "__hrtimer_run_queues",
        "call_timer_fn",
        "run_timer_softirq",
    ]) {
        "timer"
    } else if has(&[
        "net_rx_action",
        "__netif_receive_skb",
        "process_backlog",
        "tcp_v4_rcv",
    ]) {
        "network receive"
    } else if has(&[
        "blk_mq_end_request",
        "blk_update_request",
        "bio_endio",
        "blk_mq_complete",
    ]) {
        "block IO completion"
    } else if has(&[
        "handle_softirqs",
        "__do_softirq",
        "irq_exit",
        "__irq_exit_rcu",
        "common_interrupt",
        "sysvec_",
        "asm_sysvec_",
        "asm_common_interrupt",
        "handle_irq_event",
    ]) {
        "interrupt"
    } else {
        "task"
    }
}

/// The context of the wake-up `w` reports, its kernel stack named by `namer`.
pub fn context_of(namer: &mut Namer, w: &Woken) -> &'static str {
    let kernel = frames(&w.kernel[..MAX_KERNEL_FRAMES], w.kernel_len);
    if kernel.is_empty() {
        return "task";
    }
    context(&namer.name_stack(0, &[], kernel))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stack(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| format!("{n}_[k]")).collect()
    }

    #[test]
    fn a_wake_up_is_told_by_what_the_kernel_ran_it_in() {
        let futex = stack(&[
            "entry_SYSCALL_64_after_hwframe",
            "do_syscall_64",
            "__x64_sys_futex",
            "futex_wake",
            "wake_up_q",
            "try_to_wake_up",
        ]);
        assert_eq!(context(&futex), "task");
        let sleep = stack(&[
            "asm_sysvec_apic_timer_interrupt",
            "sysvec_apic_timer_interrupt",
            "__sysvec_apic_timer_interrupt",
            "hrtimer_interrupt",
            "__hrtimer_run_queues",
            "hrtimer_wakeup",
            "try_to_wake_up",
        ]);
        assert_eq!(context(&sleep), "timer");
        // Loopback: the receive runs in the sender's own system call, as a softirq.
        let loopback = stack(&[
            "__x64_sys_sendto",
            "tcp_sendmsg",
            "__local_bh_enable_ip",
            "do_softirq",
            "handle_softirqs",
            "net_rx_action",
            "__napi_poll",
            "process_backlog",
            "tcp_v4_rcv",
            "sock_def_readable",
            "__wake_up_sync_key",
            "try_to_wake_up",
        ]);
        assert_eq!(context(&loopback), "network receive");
        let disk = stack(&[
            "asm_common_interrupt",
            "blk_mq_complete_request",
            "blk_mq_end_request",
            "blk_update_request",
            "bio_endio",
            "try_to_wake_up",
        ]);
        assert_eq!(context(&disk), "block IO completion");
        let irq = stack(&["asm_common_interrupt", "common_interrupt", "try_to_wake_up"]);
        assert_eq!(context(&irq), "interrupt");
    }
}
