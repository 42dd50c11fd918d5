//! The simulated host's memory copy rate: how fast a CPU memcpy moves pageable data into the
//! driver's staging buffers (and out of them, device to host). It is a setting, not the
//! machine's own speed, so that a pageable copy takes as long on a fast host as on a slow one
//! and a test's expectation does not follow the machine it runs on. Pure: no OS calls.

/// Env var: the simulated host's memcpy rate in GB/s, read by the simulated `libcuda.so.1`.
pub const HOST_GBPS_ENV: &str = "STALLSCOPE_SIMGPU_HOST_GBPS";
/// A small VM's single-thread memcpy, and about what a pageable copy achieves on a server once
/// staging is counted; slower than any machine the tests run on, so the model, not the
/// machine, sets the time (a slower machine's own memcpy still takes longer).
pub const DEFAULT_HOST_BYTES_PER_S: f64 = 2e9;

/// The rate from `STALLSCOPE_SIMGPU_HOST_GBPS`'s value, else the default.
pub fn host_rate_from_setting(value: Option<&str>) -> f64 {
    gbps_setting(HOST_GBPS_ENV, value, DEFAULT_HOST_BYTES_PER_S)
}

/// A rate setting in GB/s (`value` of the variable `name`) as bytes per second; `default`
/// when unset, or, with a warning, when not a positive number.
pub fn gbps_setting(name: &str, value: Option<&str>, default: f64) -> f64 {
    match value.map(|v| v.trim().parse::<f64>()) {
        Some(Ok(gbps)) if gbps > 0.0 && gbps.is_finite() => gbps * 1e9,
        Some(_) => {
            eprintln!("simgpu: ignoring {name}: not a positive number of GB/s");
            default
        }
        None => default,
    }
}

/// How long the host CPU takes to copy `bytes` at `bytes_per_s`, in ns.
pub fn host_copy_ns(bytes: u64, bytes_per_s: f64) -> u64 {
    (bytes as f64 * 1e9 / bytes_per_s.max(1.0)).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_from_setting_and_copy_time() {
        assert_eq!(host_rate_from_setting(None), DEFAULT_HOST_BYTES_PER_S);
        assert_eq!(host_rate_from_setting(Some(" 4 ")), 4e9);
        assert_eq!(host_rate_from_setting(Some("0")), DEFAULT_HOST_BYTES_PER_S);
        assert_eq!(
            host_rate_from_setting(Some("fast")),
            DEFAULT_HOST_BYTES_PER_S
        );
        assert_eq!(host_copy_ns(64 << 20, 2e9), 33_554_432);
        assert_eq!(host_copy_ns(0, 2e9), 0);
    }
}
