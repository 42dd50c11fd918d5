//! The GPU part of the JSON report: per GPU, idle time by cause and each cause's evidence;
//! the stalls; the verdict.
use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::analysis::model::{Analysis, GpuTimeline};
use crate::attribution::{
    Attribution, CauseEvidence, GpuWaiting, SecondLabel, Stall, Steps, Verdict, WhatIf,
};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JsonGpu<'a> {
    pub index: u32,
    pub name: Cow<'a, str>,
    pub uuid: Cow<'a, str>,
    pub observed_ns: u64,
    /// Busy as NVML counts it: a kernel resident, waiting included.
    pub busy_ns: u64,
    /// Busy time in which the GPU only waited in collectives.
    pub waiting_ns: u64,
    pub idle_ns: u64,
    pub idle_by_cause: BTreeMap<Cow<'static, str>, u64>,
    /// Idle plus waiting time by cause: what the verdict ranks.
    pub lost_by_cause: BTreeMap<Cow<'static, str>, u64>,
    /// Which signal told waiting from work, and how certain it is.
    pub waiting: Option<Cow<'a, GpuWaiting>>,
    /// Each cause that took idle time, with its evidence summed over all its windows.
    pub causes: Cow<'a, [CauseEvidence]>,
    pub samples: usize,
    pub pcie_max_gen: u32,
    pub pcie_max_width: u32,
    /// Traced processes NVML listed on this GPU.
    pub target_pids: Cow<'a, [u32]>,
    /// Mean GPM SM activity over the recording, where the GPU has GPM (Hopper and newer).
    pub sm_active_pct: Option<f64>,
    /// The dominant cause of each second of the recording.
    pub seconds: Cow<'a, [SecondLabel]>,
    /// The feeder's training steps; absent when no probe watched it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steps: Option<Cow<'a, Steps>>,
    /// How much faster a step would be with each cause fixed, the largest gain first.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub what_if: Cow<'a, [WhatIf]>,
}

pub fn json_gpus<'a>(a: &'a Analysis, attribution: Option<&'a Attribution>) -> Vec<JsonGpu<'a>> {
    let Some(attr) = attribution else {
        return Vec::new();
    };
    attr.gpus
        .iter()
        .map(|g| {
            let info = a.gpus.get(&g.gpu).map(|t| &t.info);
            JsonGpu {
                index: g.gpu,
                name: Cow::Borrowed(info.map_or("", |i| i.name.as_str())),
                uuid: Cow::Borrowed(info.map_or("", |i| i.uuid.as_str())),
                target_pids: Cow::Borrowed(info.map_or(&[], |i| i.target_pids.as_slice())),
                observed_ns: g.observed_ns,
                busy_ns: g.busy_ns,
                waiting_ns: g.waiting_ns,
                idle_ns: g.idle_ns,
                lost_by_cause: g
                    .lost_by_cause
                    .iter()
                    .map(|(c, ns)| (Cow::Borrowed(c.name()), *ns))
                    .collect(),
                waiting: g.waiting.as_ref().map(Cow::Borrowed),
                idle_by_cause: g
                    .idle_by_cause
                    .iter()
                    .map(|(c, ns)| (Cow::Borrowed(c.name()), *ns))
                    .collect(),
                causes: Cow::Borrowed(&g.causes),
                samples: a.gpus.get(&g.gpu).map_or(0, |t| t.samples.len()),
                pcie_max_gen: info.map_or(0, |i| i.pcie_max_gen),
                pcie_max_width: info.map_or(0, |i| i.pcie_max_width),
                sm_active_pct: a.gpus.get(&g.gpu).and_then(GpuTimeline::mean_sm_active),
                seconds: Cow::Borrowed(&g.seconds),
                steps: g.steps.as_ref().map(Cow::Borrowed),
                what_if: Cow::Borrowed(&g.what_if),
            }
        })
        .collect()
}

/// Every GPU's stalls, longest first.
pub fn json_stalls(attribution: Option<&Attribution>) -> Vec<Cow<'_, Stall>> {
    let mut stalls: Vec<Cow<'_, Stall>> = attribution
        .iter()
        .flat_map(|attr| attr.gpus.iter().flat_map(|g| g.stalls.iter()))
        .map(Cow::Borrowed)
        .collect();
    stalls.sort_by(|x, y| {
        (y.idle_ns.saturating_add(y.waiting_ns))
            .cmp(&x.idle_ns.saturating_add(x.waiting_ns))
            .then(x.start_ns.cmp(&y.start_ns))
    });
    stalls
}

pub fn json_verdict(attribution: Option<&Attribution>) -> Option<Cow<'_, Verdict>> {
    attribution.map(|attr| Cow::Borrowed(&attr.verdict))
}
