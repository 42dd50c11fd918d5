//! Checks, before touching the kernel, that this process may load eBPF and read the
//! target's /proc, and names every missing capability.
const CAP_DAC_READ_SEARCH: u32 = 2;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Names of the capabilities missing from the effective set `cap_eff`. CAP_SYS_ADMIN stands
/// in for CAP_BPF and CAP_PERFMON, as on kernels before 5.8.
pub fn missing(cap_eff: u64) -> Vec<&'static str> {
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    let admin = has(CAP_SYS_ADMIN);
    let mut out = Vec::new();
    if !has(CAP_BPF) && !admin {
        out.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) && !admin {
        out.push("CAP_PERFMON");
    }
    if !has(CAP_SYS_PTRACE) {
        out.push("CAP_SYS_PTRACE");
    }
    if !has(CAP_DAC_READ_SEARCH) {
        out.push("CAP_DAC_READ_SEARCH");
    }
    out
}

fn cap_eff() -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| anyhow::anyhow!("no CapEff line in /proc/self/status"))?;
    Ok(u64::from_str_radix(hex.trim(), 16)?)
}

pub fn check() -> anyhow::Result<()> {
    let missing = missing(cap_eff()?);
    if missing.is_empty() {
        return Ok(());
    }
    let exe = std::env::args()
        .next()
        .unwrap_or_else(|| "stallscope".into());
    anyhow::bail!(
        "insufficient privileges: missing {}.\n\
         Run it as root (`sudo {exe} record ...`), or grant the capabilities once:\n  \
         sudo setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep {exe}",
        missing.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_what_is_missing() {
        assert_eq!(
            missing(0),
            [
                "CAP_BPF",
                "CAP_PERFMON",
                "CAP_SYS_PTRACE",
                "CAP_DAC_READ_SEARCH"
            ]
        );
        let all = (1 << CAP_BPF)
            | (1 << CAP_PERFMON)
            | (1 << CAP_SYS_PTRACE)
            | (1 << CAP_DAC_READ_SEARCH);
        assert!(missing(all).is_empty());
        let admin = (1 << CAP_SYS_ADMIN) | (1 << CAP_SYS_PTRACE) | (1 << CAP_DAC_READ_SEARCH);
        assert!(missing(admin).is_empty());
        assert_eq!(
            missing(1 << CAP_BPF),
            ["CAP_PERFMON", "CAP_SYS_PTRACE", "CAP_DAC_READ_SEARCH"]
        );
    }
}
