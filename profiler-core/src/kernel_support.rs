//! What each part of a recording needs from the kernel, and what is left out, with why, on a
//! kernel that lacks it. The recorder reads what the kernel has from its BTF (the helpers in
//! `enum bpf_func_id`, the map types, the `sched_switch` tracepoint's arguments), so a
//! distribution's backports count, and chooses here before loading: a missing helper that
//! one part needs switches that part off, named once, and the rest runs.

/// Something the eBPF programs use that not every kernel has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Feature {
    /// `BPF_MAP_TYPE_RINGBUF`: every event reaches user space through it.
    RingBuffer,
    /// `bpf_get_current_task_btf`: the sampling and switch programs read the task with it.
    CurrentTaskBtf,
    /// Callbacks (`BPF_PSEUDO_FUNC`, which came with `bpf_for_each_map_elem`): the Python
    /// walk's loop body is one, and the kernel must accept its address even when the walk is
    /// off.
    Callbacks,
    /// `bpf_task_pt_regs`: the user registers for DWARF unwinding and a blocked thread's
    /// system call.
    TaskPtRegs,
    /// `bpf_get_attach_cookie`: one CUDA program tells the probed functions apart with it.
    AttachCookie,
    /// `bpf_loop`: the walk of a Python thread's frames.
    BpfLoop,
    /// The `sched_switch` tracepoint's `prev_state` argument; without it the state is read
    /// from the task, as the per-thread hook does.
    SchedSwitchPrevState,
}

impl Feature {
    pub const ALL: [Feature; 7] = [
        Feature::RingBuffer,
        Feature::CurrentTaskBtf,
        Feature::Callbacks,
        Feature::TaskPtRegs,
        Feature::AttachCookie,
        Feature::BpfLoop,
        Feature::SchedSwitchPrevState,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Feature::RingBuffer => "the BPF ring buffer",
            Feature::CurrentTaskBtf => "bpf_get_current_task_btf",
            Feature::Callbacks => "BPF callbacks",
            Feature::TaskPtRegs => "bpf_task_pt_regs",
            Feature::AttachCookie => "bpf_get_attach_cookie",
            Feature::BpfLoop => "bpf_loop",
            Feature::SchedSwitchPrevState => "sched_switch's prev_state argument",
        }
    }

    /// The mainline release that brought it.
    pub fn since(self) -> (u32, u32) {
        match self {
            Feature::RingBuffer => (5, 8),
            Feature::CurrentTaskBtf => (5, 11),
            Feature::Callbacks => (5, 13),
            Feature::TaskPtRegs | Feature::AttachCookie => (5, 15),
            Feature::BpfLoop => (5, 17),
            Feature::SchedSwitchPrevState => (5, 18),
        }
    }

    /// Without it nothing can be recorded.
    pub fn required(self) -> bool {
        matches!(
            self,
            Feature::RingBuffer | Feature::CurrentTaskBtf | Feature::Callbacks
        )
    }

    fn since_text(self) -> String {
        let (a, b) = self.since();
        format!("Linux {a}.{b}")
    }
}

/// The features a kernel has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KernelFeatures(std::collections::BTreeSet<Feature>);

impl KernelFeatures {
    pub fn all() -> Self {
        Self(Feature::ALL.into_iter().collect())
    }

    pub fn from_features(features: impl IntoIterator<Item = Feature>) -> Self {
        Self(features.into_iter().collect())
    }

    /// What a mainline kernel of this release has (a distribution's may have more).
    pub fn of_mainline(major: u32, minor: u32) -> Self {
        Self(
            Feature::ALL
                .into_iter()
                .filter(|f| f.since() <= (major, minor))
                .collect(),
        )
    }

    pub fn has(&self, f: Feature) -> bool {
        self.0.contains(&f)
    }

    /// What both have: a kernel seen as if it were an older one.
    pub fn intersection(&self, other: &KernelFeatures) -> KernelFeatures {
        Self(self.0.intersection(&other.0).copied().collect())
    }

    pub fn missing(&self) -> Vec<Feature> {
        Feature::ALL.into_iter().filter(|f| !self.has(*f)).collect()
    }
}

/// What the user asked for that depends on the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    pub python_stacks: bool,
    pub dwarf_unwind: bool,
    pub cuda_probes: bool,
}

/// What runs on this kernel, and each part left out with the reason (the report's
/// `unavailable` list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    pub python_stacks: bool,
    pub dwarf_unwind: bool,
    /// A blocked thread's system call, read from its saved registers.
    pub syscalls: bool,
    pub cuda_probes: bool,
    /// Read `sched_switch`'s `prev_state` argument, else the task's state field.
    pub prev_state_arg: bool,
    pub unavailable: Vec<(String, String)>,
}

/// Chooses what runs. Fails, naming every missing requirement and the release that brought
/// it, when nothing can be recorded; `has_task_state` says whether BTF gave the task's state
/// field, the fallback for `prev_state`.
pub fn choose(
    features: &KernelFeatures,
    wanted: Wanted,
    has_task_state: bool,
) -> Result<Choice, String> {
    let mut fatal: Vec<String> = Feature::ALL
        .into_iter()
        .filter(|f| f.required() && !features.has(*f))
        .map(|f| format!("{} ({})", f.name(), f.since_text()))
        .collect();
    let prev_state_arg = features.has(Feature::SchedSwitchPrevState);
    if !prev_state_arg && !has_task_state {
        fatal.push(format!(
            "{} ({}) or task_struct's state in BTF",
            Feature::SchedSwitchPrevState.name(),
            Feature::SchedSwitchPrevState.since_text()
        ));
    }
    if !fatal.is_empty() {
        return Err(format!(
            "this kernel lacks what stallscope needs to record: {}; stallscope needs Linux 5.13 \
             or a kernel with these backported",
            fatal.join(", ")
        ));
    }
    let mut unavailable = Vec::new();
    let mut lack = |f: Feature, signal: &str, loses: &str| {
        unavailable.push((
            signal.to_owned(),
            format!(
                "this kernel lacks {} ({}): {loses}",
                f.name(),
                f.since_text()
            ),
        ));
    };
    let loop_ok = features.has(Feature::BpfLoop);
    if wanted.python_stacks && !loop_ok {
        lack(
            Feature::BpfLoop,
            "python_stacks",
            "samples and CUDA calls carry native frames only",
        );
    }
    let regs_ok = features.has(Feature::TaskPtRegs);
    if !regs_ok {
        let loses = if wanted.dwarf_unwind {
            "stacks are walked by frame pointers, not DWARF, and a blocked thread's system \
             call is not named"
        } else {
            "a blocked thread's system call is not named"
        };
        lack(Feature::TaskPtRegs, "task_pt_regs", loses);
    }
    let cookie_ok = features.has(Feature::AttachCookie);
    if wanted.cuda_probes && !cookie_ok {
        lack(
            Feature::AttachCookie,
            "cuda",
            "CUDA and NCCL calls are not timed; a GPU wait inside CUDA reads as on-CPU work",
        );
    }
    Ok(Choice {
        python_stacks: wanted.python_stacks && loop_ok,
        dwarf_unwind: wanted.dwarf_unwind && regs_ok,
        syscalls: regs_ok,
        cuda_probes: wanted.cuda_probes && cookie_ok,
        prev_state_arg,
        unavailable,
    })
}

/// `doctor`'s judgement of the kernel for recording: pass when it has everything, warn naming
/// what each missing feature loses and the release that brought it, fail when nothing can be
/// recorded.
pub fn doctor_check(
    release: &str,
    features: &KernelFeatures,
    has_task_state: bool,
) -> crate::doctor::Check {
    use crate::doctor::Check;
    const NAME: &str = "kernel: eBPF features";
    let all = Wanted {
        python_stacks: true,
        dwarf_unwind: true,
        cuda_probes: true,
    };
    match choose(features, all, has_task_state) {
        Err(why) => Check::fail(
            NAME,
            format!("Linux {release}: {why}"),
            "run a newer kernel (5.15 or later; 5.18 for everything), such as the \
             distribution's HWE or UEK kernel",
        ),
        Ok(c) if c.unavailable.is_empty() => Check::pass(
            NAME,
            format!(
                "Linux {release} has everything stallscope uses{}",
                if c.prev_state_arg {
                    ""
                } else {
                    " (a thread's state read from the task: sched_switch has no prev_state)"
                }
            ),
        ),
        Ok(c) => Check::warn(
            NAME,
            format!(
                "Linux {release}: {}",
                c.unavailable
                    .iter()
                    .map(|(_, why)| why.trim_start_matches("this kernel lacks ").to_owned())
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            "record anyway (the rest works), or run Linux 5.17 or later for Python frames \
             and 5.15 for DWARF stacks and CUDA call timing",
        ),
    }
}

/// A kernel release's `major.minor` from a `uname -r` string such as `5.15.0-91-generic`.
pub fn release_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL_ON: Wanted = Wanted {
        python_stacks: true,
        dwarf_unwind: true,
        cuda_probes: true,
    };

    fn signals(c: &Choice) -> Vec<&str> {
        c.unavailable.iter().map(|(s, _)| s.as_str()).collect()
    }

    #[test]
    fn a_6x_kernel_runs_everything() {
        let c = choose(&KernelFeatures::of_mainline(6, 8), ALL_ON, true).unwrap();
        assert!(c.python_stacks && c.dwarf_unwind && c.syscalls && c.cuda_probes);
        assert!(c.prev_state_arg);
        assert!(c.unavailable.is_empty());
    }

    #[test]
    fn ubuntu_22_04s_5_15_loses_python_frames_only() {
        let c = choose(&KernelFeatures::of_mainline(5, 15), ALL_ON, true).unwrap();
        assert!(!c.python_stacks, "bpf_loop came in 5.17");
        assert!(c.dwarf_unwind && c.syscalls && c.cuda_probes);
        assert!(
            !c.prev_state_arg,
            "prev_state came in 5.18: read from the task"
        );
        assert_eq!(signals(&c), ["python_stacks"]);
        assert!(c.unavailable[0].1.contains("bpf_loop (Linux 5.17)"));
    }

    #[test]
    fn rhel_9s_5_14_also_loses_dwarf_syscalls_and_cuda_timing() {
        let c = choose(&KernelFeatures::of_mainline(5, 14), ALL_ON, true).unwrap();
        assert!(!c.python_stacks && !c.dwarf_unwind && !c.syscalls && !c.cuda_probes);
        assert_eq!(signals(&c), ["python_stacks", "task_pt_regs", "cuda"]);
        let regs = &c.unavailable[1].1;
        assert!(
            regs.contains("bpf_task_pt_regs (Linux 5.15)") && regs.contains("frame pointers"),
            "{regs}"
        );
    }

    #[test]
    fn what_was_not_asked_for_is_not_reported_missing() {
        let wanted = Wanted {
            python_stacks: false,
            dwarf_unwind: false,
            cuda_probes: false,
        };
        let c = choose(&KernelFeatures::of_mainline(5, 14), wanted, true).unwrap();
        assert_eq!(signals(&c), ["task_pt_regs"]);
        assert!(!c.unavailable[0].1.contains("DWARF"));
    }

    #[test]
    fn older_kernels_are_refused_naming_each_requirement() {
        let e = choose(&KernelFeatures::of_mainline(5, 10), ALL_ON, true).unwrap_err();
        assert!(
            e.contains("bpf_get_current_task_btf (Linux 5.11)")
                && e.contains("BPF callbacks (Linux 5.13)")
                && !e.contains("ring buffer"),
            "{e}"
        );
        let e = choose(&KernelFeatures::of_mainline(5, 4), ALL_ON, true).unwrap_err();
        assert!(e.contains("the BPF ring buffer (Linux 5.8)"), "{e}");
        let e = choose(&KernelFeatures::of_mainline(5, 15), ALL_ON, false).unwrap_err();
        assert!(e.contains("prev_state"), "{e}");
    }

    #[test]
    fn a_backport_counts_and_a_mask_only_removes() {
        let mut rhel = KernelFeatures::of_mainline(5, 14);
        rhel.0.insert(Feature::BpfLoop);
        let c = choose(&rhel, ALL_ON, true).unwrap();
        assert!(c.python_stacks, "a backported bpf_loop walks Python frames");
        let masked = KernelFeatures::all().intersection(&KernelFeatures::of_mainline(5, 15));
        assert_eq!(masked, KernelFeatures::of_mainline(5, 15));
    }

    #[test]
    fn releases_parse_as_distributions_write_them() {
        assert_eq!(release_version("5.15.0-91-generic"), Some((5, 15)));
        assert_eq!(
            release_version("5.14.0-362.8.1.el9_3.x86_64"),
            Some((5, 14))
        );
        assert_eq!(release_version("6.18"), Some((6, 18)));
        assert_eq!(release_version("garbage"), None);
    }

    #[test]
    fn doctor_passes_warns_and_fails_by_what_the_kernel_has() {
        use crate::doctor::Status;
        let check = |v: (u32, u32)| doctor_check("x", &KernelFeatures::of_mainline(v.0, v.1), true);
        assert_eq!(check((6, 8)).status, Status::Pass);
        let c = check((5, 15));
        assert_eq!(c.status, Status::Warn);
        assert!(
            c.evidence.contains("bpf_loop (Linux 5.17)"),
            "{}",
            c.evidence
        );
        assert_eq!(check((5, 10)).status, Status::Fail);
    }
}
