//! What this kernel offers the eBPF programs, read from its BTF: the helpers it lists in
//! `enum bpf_func_id`, the map types in `enum bpf_map_type`, and the `sched_switch`
//! tracepoint's parameters. A distribution's backports show there as they do in the kernel.
use profiler_core::kernel_support::{Feature, KernelFeatures, release_version};

use super::btf::Btf;

/// Records as if on that mainline release (`STALLSCOPE_KERNEL_AS=5.15`): it only takes away
/// what this kernel has, so the tests can run older kernels' choices on this one.
pub const KERNEL_AS_ENV: &str = "STALLSCOPE_KERNEL_AS";

pub fn probe(btf: &Btf) -> KernelFeatures {
    let helper = |name: &str| btf.has_enumerator("bpf_func_id", name);
    let found = Feature::ALL.into_iter().filter(|f| match f {
        Feature::RingBuffer => btf.has_enumerator("bpf_map_type", "BPF_MAP_TYPE_RINGBUF"),
        Feature::CurrentTaskBtf => helper("BPF_FUNC_get_current_task_btf"),
        // Callbacks came with the first helper that takes one.
        Feature::Callbacks => helper("BPF_FUNC_for_each_map_elem"),
        Feature::TaskPtRegs => helper("BPF_FUNC_task_pt_regs"),
        Feature::AttachCookie => helper("BPF_FUNC_get_attach_cookie"),
        Feature::BpfLoop => helper("BPF_FUNC_loop"),
        // (void *ctx, bool preempt, prev, next, unsigned int prev_state)
        Feature::SchedSwitchPrevState => btf
            .typedef_params("btf_trace_sched_switch")
            .is_some_and(|n| n >= 5),
    });
    KernelFeatures::from_features(found)
}

/// `probed`, less what the release in [`KERNEL_AS_ENV`] lacks, when it is set.
pub fn masked(probed: KernelFeatures) -> anyhow::Result<KernelFeatures> {
    let Some(release) = std::env::var_os(KERNEL_AS_ENV) else {
        return Ok(probed);
    };
    let release = release.to_string_lossy();
    let (major, minor) = release_version(&release).ok_or_else(|| {
        anyhow::anyhow!("{KERNEL_AS_ENV}={release}: not a kernel release such as 5.15")
    })?;
    eprintln!("stallscope: recording as if on Linux {major}.{minor} ({KERNEL_AS_ENV})");
    Ok(probed.intersection(&KernelFeatures::of_mainline(major, minor)))
}
