//! Driver and CUDA versions: the kernel module against NVML's library, and the CUDA runtime a
//! process loaded against the newest CUDA the driver supports.
use super::Check;

/// The kernel module's version from `/proc/driver/nvidia/version`
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Tue ...`; open modules say
/// `Open Kernel Module for x86_64`).
pub fn module_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        .map(str::to_owned)
}

/// The loaded module against the user-space library NVML reports: after a driver upgrade
/// without a reboot they differ, and NVML refuses with "Driver/library version mismatch".
pub fn driver_match(module: &str, library: &str) -> Check {
    if module == library {
        Check::pass(
            "driver version",
            format!("kernel module and NVML library are both {module}"),
        )
    } else {
        Check::fail(
            "driver version",
            format!(
                "kernel module {module}, NVML library {library}: driver/library version mismatch"
            ),
            "the driver was upgraded under a running module: reboot, or unload and reload the \
             nvidia modules with no process on the GPUs",
        )
    }
}

/// A CUDA version as NVML and cudaRuntimeGetVersion encode it: 1000 × major + 10 × minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CudaVersion {
    pub major: u32,
    pub minor: u32,
}

impl CudaVersion {
    pub fn from_encoded(v: i32) -> Self {
        let v = v.max(0) as u32;
        CudaVersion {
            major: v / 1000,
            minor: (v % 1000) / 10,
        }
    }
}

impl std::fmt::Display for CudaVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The CUDA runtime version a loaded `libcudart` file is: from its file name
/// (`libcudart.so.12.4.127`), else from the pip wheel's `dist-info` beside it
/// (`nvidia_cuda_runtime_cu12-12.4.127.dist-info`, `nvidia_cuda_runtime-13.0.96.dist-info`),
/// else its SONAME's major alone (`libcudart.so.13`, minor 0). `dist_infos` are the names of
/// the `*.dist-info` folders of the site-packages the file is under.
pub fn cudart_version(file_name: &str, dist_infos: &[String]) -> Option<CudaVersion> {
    let numbers = |s: &str| -> Vec<u32> { s.split('.').map_while(|p| p.parse().ok()).collect() };
    let tail = file_name.strip_prefix("libcudart.so.")?;
    let from_name = numbers(tail);
    if let [major, minor, ..] = from_name[..] {
        return Some(CudaVersion { major, minor });
    }
    let major = *from_name.first()?;
    let wheel = dist_infos.iter().find_map(|d| {
        let rest = d
            .strip_prefix("nvidia_cuda_runtime")?
            .strip_suffix(".dist-info")?;
        let version = rest.rsplit_once('-')?.1;
        match numbers(version)[..] {
            [m, minor, ..] if m == major => Some(CudaVersion { major, minor }),
            _ => None,
        }
    });
    Some(wheel.unwrap_or(CudaVersion { major, minor: 0 }))
}

/// The runtime a process loaded against the driver's newest CUDA. A newer major fails at
/// cudaInit with "CUDA driver version is insufficient for CUDA runtime version"; a newer
/// minor of the same major runs (minor-version compatibility) but cannot JIT newer PTX.
pub fn runtime_vs_driver(runtime: CudaVersion, driver: CudaVersion, lib: &str) -> Check {
    let shown = format!(
        "the process loaded CUDA runtime {runtime} ({lib}); the driver supports up to CUDA {driver}"
    );
    if runtime.major > driver.major {
        Check::fail(
            "CUDA runtime vs driver",
            format!("{shown}: CUDA driver version is insufficient for CUDA runtime version"),
            "install a driver that supports this CUDA (nvidia-smi shows its maximum, top right), \
             or a framework build for an older CUDA",
        )
    } else if runtime > driver {
        Check::warn(
            "CUDA runtime vs driver",
            format!(
                "{shown}: runs by minor-version compatibility, but PTX newer than the driver cannot be JIT-compiled"
            ),
            "upgrade the driver to one that supports this CUDA minor version",
        )
    } else {
        Check::pass("CUDA runtime vs driver", shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Status;

    #[test]
    fn module_versions_parse_for_both_module_flavours() {
        let proprietary = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Tue Jan 14 \
                           03:12:31 UTC 2025\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(module_version(proprietary).as_deref(), Some("570.86.15"));
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release \
                    Build  (dvs-builder@U16-I3-B03-4-3)  Wed Aug 27 2025\n";
        assert_eq!(module_version(open).as_deref(), Some("580.82.07"));
        assert_eq!(module_version("garbage"), None);
        assert_eq!(driver_match("570.86.15", "570.86.15").status, Status::Pass);
        assert_eq!(driver_match("570.86.15", "580.82.07").status, Status::Fail);
    }

    #[test]
    fn cudart_versions_come_from_the_name_or_the_wheel() {
        let v = |major, minor| Some(CudaVersion { major, minor });
        assert_eq!(cudart_version("libcudart.so.12.4.127", &[]), v(12, 4));
        let wheels = vec![
            "torch-2.9.0.dist-info".to_owned(),
            "nvidia_cuda_runtime-13.1.80.dist-info".to_owned(),
        ];
        assert_eq!(cudart_version("libcudart.so.13", &wheels), v(13, 1));
        let cu12 = vec!["nvidia_cuda_runtime_cu12-12.8.90.dist-info".to_owned()];
        assert_eq!(cudart_version("libcudart.so.12", &cu12), v(12, 8));
        assert_eq!(cudart_version("libcudart.so.12", &[]), v(12, 0));
        assert_eq!(cudart_version("libcuda.so.1", &[]), None);
    }

    #[test]
    fn an_older_driver_major_fails_and_an_older_minor_warns() {
        let c = |v| CudaVersion::from_encoded(v);
        assert_eq!(
            c(12080),
            CudaVersion {
                major: 12,
                minor: 8
            }
        );
        assert_eq!(
            runtime_vs_driver(c(13000), c(11080), "x").status,
            Status::Fail
        );
        assert_eq!(
            runtime_vs_driver(c(12080), c(12040), "x").status,
            Status::Warn
        );
        assert_eq!(
            runtime_vs_driver(c(12040), c(12080), "x").status,
            Status::Pass
        );
    }
}
