//! Checks of one process (`doctor --pid`): which physical GPUs its CUDA device numbers are,
//! its allocator and DataLoader settings, and whether its GPU memory keeps growing.
use super::{Check, gib};

/// A physical GPU as NVML numbers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Physical {
    pub index: u32,
    pub uuid: String,
    pub bus_id: String,
    pub name: String,
}

/// CUDA's devices for a `CUDA_VISIBLE_DEVICES` value: each entry an NVML index, a UUID or a
/// unique UUID prefix (`GPU-5eed`), or a MIG UUID. As CUDA does, the list ends at the first
/// entry that matches nothing (the rest are ignored); `Err` names that entry.
pub fn visible_devices<'g>(
    value: &str,
    gpus: &'g [Physical],
) -> (Vec<&'g Physical>, Option<String>) {
    let mut out = Vec::new();
    for raw in value.split(',') {
        let entry = raw.trim();
        let found = if let Ok(i) = entry.parse::<u32>() {
            gpus.iter().find(|g| g.index == i)
        } else if entry.starts_with("GPU-") {
            let mut m = gpus.iter().filter(|g| g.uuid.starts_with(entry));
            match (m.next(), m.next()) {
                (Some(one), None) => Some(one),
                _ => None,
            }
        } else {
            None
        };
        match found {
            Some(g) if !out.contains(&g) => out.push(g),
            _ => return (out, Some(entry.to_owned())),
        }
    }
    (out, None)
}

/// The target's CUDA device numbers against NVML's (nvidia-smi's) numbers. `order` is
/// `CUDA_DEVICE_ORDER`: unless it is `PCI_BUS_ID`, CUDA puts the fastest GPU first, so on a
/// host of mixed GPUs its device 0 need not be nvidia-smi's GPU 0.
pub fn device_mapping(
    visible: Option<&str>,
    order: Option<&str>,
    gpus: &[Physical],
    holds_memory_on: &[u32],
) -> Check {
    let (list, stopped) = match visible {
        None => (gpus.iter().collect(), None),
        Some(v) if v.trim().is_empty() => (Vec::new(), None),
        Some(v) => visible_devices(v, gpus),
    };
    let shown = list
        .iter()
        .enumerate()
        .map(|(cuda, g)| format!("cuda:{cuda} = GPU {} ({}, {})", g.index, g.uuid, g.bus_id))
        .collect::<Vec<_>>()
        .join("; ");
    let setting = visible.map_or_else(
        || "CUDA_VISIBLE_DEVICES unset".to_owned(),
        |v| format!("CUDA_VISIBLE_DEVICES={v}"),
    );
    let held = if holds_memory_on.is_empty() {
        String::new()
    } else {
        format!(
            "; it holds memory on GPU {}",
            holds_memory_on
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    let evidence = format!("{setting}: {shown}{held}");
    if list.is_empty() {
        return Check::fail(
            "CUDA devices",
            format!("{setting}: the process can see no GPU{held}"),
            "CUDA_VISIBLE_DEVICES names no GPU of this host: use nvidia-smi -L's indices or UUIDs",
        );
    }
    if let Some(bad) = stopped {
        return Check::warn(
            "CUDA devices",
            format!(
                "{evidence}; \"{bad}\" matches no GPU, so CUDA ignores it and every entry after it"
            ),
            "fix the entry: nvidia-smi -L lists the indices and UUIDs",
        );
    }
    let mixed = gpus.windows(2).any(|w| w[0].name != w[1].name);
    if mixed && order != Some("PCI_BUS_ID") {
        return Check::warn(
            "CUDA devices",
            format!(
                "{evidence}; the GPUs differ and CUDA numbers the fastest first, so cuda:N need not be nvidia-smi's N"
            ),
            "export CUDA_DEVICE_ORDER=PCI_BUS_ID so CUDA and nvidia-smi number GPUs alike",
        );
    }
    if let Some(stray) = holds_memory_on
        .iter()
        .find(|i| !list.iter().any(|g| g.index == **i))
    {
        return Check::warn(
            "CUDA devices",
            format!("{evidence}; GPU {stray} is not among those it should see"),
            "a child process or library ignores CUDA_VISIBLE_DEVICES: check how the job is launched",
        );
    }
    Check::pass("CUDA devices", evidence)
}

/// `PYTORCH_CUDA_ALLOC_CONF` as the target runs with it.
pub fn alloc_conf(value: Option<&str>) -> Check {
    match value {
        Some(v) => Check::pass("PyTorch allocator", format!("PYTORCH_CUDA_ALLOC_CONF={v}")),
        None => Check::pass(
            "PyTorch allocator",
            "PYTORCH_CUDA_ALLOC_CONF unset (defaults); on OOM with free memory, \
             max_split_size_mb:128 or expandable_segments:True fights fragmentation",
        ),
    }
}

/// DataLoader workers seen from outside: child processes running the target's interpreter.
pub fn dataloader_workers(workers: usize, imports_torch: bool) -> Check {
    if workers == 0 && imports_torch {
        Check::warn(
            "DataLoader workers",
            "no worker process: with num_workers=0 the training loop loads every batch itself",
            "DataLoader(num_workers=N, persistent_workers=True, pin_memory=True) moves loading \
             off the loop",
        )
    } else {
        Check::pass(
            "DataLoader workers",
            format!("{workers} child process(es) running the same program"),
        )
    }
}

/// The target's GPU memory over a few seconds: `(seconds, bytes)` samples. Steady growth is
/// what a leak looks like (the guide: memory rising every epoch until OOM).
pub fn memory_trend(samples: &[(f64, u64)]) -> Check {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Check::unavailable("GPU memory trend", "no sample of the process's GPU memory");
    };
    let span = last.0 - first.0;
    if samples.len() < 3 || span <= 0.0 {
        return Check::unavailable(
            "GPU memory trend",
            "the process held no GPU memory NVML could see while sampled",
        );
    }
    let rises = samples.windows(2).filter(|w| w[1].1 > w[0].1).count();
    let falls = samples.windows(2).filter(|w| w[1].1 < w[0].1).count();
    let grew = last.1.saturating_sub(first.1);
    let evidence = format!(
        "{} → {} over {span:.1} s ({} samples)",
        gib(first.1),
        gib(last.1),
        samples.len()
    );
    // Steady: it went up at least half the time, never down, by more than 16 MiB.
    if falls == 0 && rises * 2 >= samples.len() - 1 && grew > 16 << 20 {
        Check::warn(
            "GPU memory trend",
            format!(
                "{evidence}: grew steadily, {:.0} MiB/s",
                grew as f64 / f64::from(1u32 << 20) / span
            ),
            "a leak keeps tensors alive across steps (a loss kept without .item(), a growing \
             list): watch torch.cuda.memory_allocated() per step, or \
             torch.cuda.memory._dump_snapshot()",
        )
    } else {
        Check::pass("GPU memory trend", format!("{evidence}: no steady growth"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    fn gpus() -> Vec<Physical> {
        (0..4)
            .map(|i| Physical {
                index: i,
                uuid: format!("GPU-{i}aaa-{i}"),
                bus_id: format!("00000000:{i}B:00.0"),
                name: "H100".into(),
            })
            .collect()
    }

    #[test]
    fn visible_devices_renumber_from_zero_and_stop_at_a_bad_entry() {
        let g = gpus();
        let (list, bad) = visible_devices("2,3", &g);
        assert_eq!(list.iter().map(|g| g.index).collect::<Vec<_>>(), [2, 3]);
        assert_eq!(bad, None);
        let (list, bad) = visible_devices("GPU-3aaa,7,1", &g);
        assert_eq!(list.iter().map(|g| g.index).collect::<Vec<_>>(), [3]);
        assert_eq!(bad.as_deref(), Some("7"));
        let c = device_mapping(Some("2,3"), None, &g, &[2]);
        assert_eq!(c.status, Status::Pass);
        assert!(c.evidence.contains("cuda:0 = GPU 2"), "{}", c.evidence);
        assert!(c.evidence.contains("cuda:1 = GPU 3"));
        assert_eq!(
            device_mapping(Some("2,3"), None, &g, &[0]).status,
            Status::Warn
        );
        assert_eq!(
            device_mapping(Some("9"), None, &g, &[]).status,
            Status::Fail
        );
        let mut mixed = g.clone();
        mixed[3].name = "A10".into();
        assert_eq!(device_mapping(None, None, &mixed, &[]).status, Status::Warn);
        assert_eq!(
            device_mapping(None, Some("PCI_BUS_ID"), &mixed, &[]).status,
            Status::Pass
        );
    }

    #[test]
    fn steady_growth_warns_and_a_plateau_passes() {
        let growing: Vec<_> = (0..8)
            .map(|i| (i as f64 * 0.5, (1u64 << 30) + i * (64 << 20)))
            .collect();
        let c = memory_trend(&growing);
        assert_eq!(c.status, Status::Warn, "{}", c.evidence);
        assert!(c.evidence.contains("128 MiB/s"), "{}", c.evidence);
        let flat: Vec<_> = (0..8).map(|i| (i as f64 * 0.5, 1u64 << 30)).collect();
        assert_eq!(memory_trend(&flat).status, Status::Pass);
        let sawtooth: Vec<_> = (0..8)
            .map(|i| (i as f64 * 0.5, (1u64 << 30) + (i % 2) * (256 << 20)))
            .collect();
        assert_eq!(memory_trend(&sawtooth).status, Status::Pass);
        assert_eq!(memory_trend(&[]).status, Status::Unavailable);
    }
}
