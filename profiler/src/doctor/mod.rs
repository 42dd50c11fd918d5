//! `stallscope doctor`: gathers the readings (NVML, procfs, `/dev/kmsg`) and hands them to the
//! judgements in [`profiler_core::doctor`]. The order is the guides': driver, kernel log, each
//! GPU, then the job.
mod host;
mod nvml;

use nvml_wrapper::Nvml;
use profiler_core::doctor::{
    Check, Diagnosis, gpu, kernel_log,
    target::{self, Physical},
    versions::{self, CudaVersion},
};

use crate::{
    nvml_reader,
    plan::{DoctorPlan, Since},
};
use profiler_core::Format;

pub fn run(args: &DoctorPlan) -> anyhow::Result<i32> {
    let target_info = match args.pid {
        Some(pid) => Some((pid, host::target(pid)?)),
        None => None,
    };
    let mut d = Diagnosis::default();
    let module = std::fs::read_to_string(&args.driver_version_file)
        .ok()
        .and_then(|t| versions::module_version(&t));
    d.checks.push(match &module {
        Some(v) => Check::pass("kernel module", format!("nvidia {v} loaded")),
        None => Check::fail(
            "kernel module",
            format!(
                "{} is missing or unreadable: the nvidia kernel module is not loaded",
                args.driver_version_file.display()
            ),
            "lsmod | grep nvidia; dmesg | grep -i nvidia (Secure Boot, nouveau, a kernel \
             without the module's headers)",
        ),
    });
    let lib = nvml_reader::library(args.nvml_lib.clone());
    let nvml = nvml_reader::open(&lib);
    let driver = match &nvml {
        Ok(n) => {
            let library = n.sys_driver_version().unwrap_or_default();
            let cuda = n.sys_cuda_driver_version().map(CudaVersion::from_encoded);
            d.checks.push(Check::pass(
                "NVML",
                format!(
                    "driver {library}, CUDA {} at most, {} GPU(s)",
                    cuda.as_ref()
                        .map_or_else(|_| "?".to_owned(), |c| c.to_string()),
                    n.device_count().unwrap_or(0)
                ),
            ));
            if let Some(m) = &module {
                d.checks.push(versions::driver_match(m, &library));
            }
            cuda.ok()
        }
        Err(e) => {
            d.checks.push(nvml::init_failure(&lib, e));
            None
        }
    };

    let now = host::monotonic_usec();
    match host::kernel_log() {
        Ok(records) => {
            let (kept, scope) = match args.kernel_log_since {
                Since::Boot => (records, "since boot".to_owned()),
                Since::Last(span) => {
                    let from = now.saturating_sub(span.as_micros() as u64);
                    let kept = records.into_iter().filter(|r| r.usec >= from).collect();
                    (kept, format!("of the last {span:?}"))
                }
            };
            d.checks.extend(kernel_log::checks(&kept, now, &scope));
        }
        Err(why) => d.checks.push(Check::unavailable("kernel log", why)),
    }
    d.checks.push(match host::kernel_features() {
        Ok((release, features, has_state)) => {
            profiler_core::kernel_support::doctor_check(&release, &features, has_state)
        }
        Err(why) => Check::fail(
            "kernel: eBPF features",
            why,
            "boot a kernel built with CONFIG_DEBUG_INFO_BTF=y (every major distribution's \
             since 2021)",
        ),
    });

    let mut physical = Vec::new();
    if let Ok(n) = &nvml {
        let holder = |pid, bytes| host::holder(pid, bytes, args.pid);
        for i in 0..n.device_count().unwrap_or(0) {
            match n.device_by_index(i) {
                Ok(dev) => {
                    let r = nvml::readings(n, &dev, i, &holder);
                    physical.push(nvml_reader::identity(&dev, i));
                    d.checks.extend(gpu::checks(&r));
                }
                Err(e) => d.checks.push(
                    Check::fail(
                        "GPU",
                        format!("NVML cannot open GPU {i}: {e}"),
                        "dmesg | grep -i xid; a lost GPU needs a reset or reboot",
                    )
                    .on_gpu(i),
                ),
            }
        }
    }

    if let Some((pid, info)) = &target_info {
        job_checks(
            &mut d,
            *pid,
            info,
            nvml.as_ref().ok(),
            &physical,
            driver,
            args,
        );
    }

    match args.format {
        Format::Json => println!("{}", d.to_json()),
        _ => print!("{}", d.to_text()),
    }
    Ok(d.exit_code())
}

fn job_checks(
    d: &mut Diagnosis,
    pid: u32,
    info: &host::TargetInfo,
    nvml: Option<&Nvml>,
    physical: &[Physical],
    driver: Option<CudaVersion>,
    args: &DoctorPlan,
) {
    let env = |k: &str| info.env.get(k).map(String::as_str);
    let holds = nvml
        .map(|n| nvml_reader::memory_of(n, pid).1)
        .unwrap_or_default();
    d.checks.push(if nvml.is_some() {
        target::device_mapping(
            env("CUDA_VISIBLE_DEVICES"),
            env("CUDA_DEVICE_ORDER"),
            physical,
            &holds,
        )
    } else {
        Check::unavailable("CUDA devices", "NVML is not available to list the GPUs")
    });
    d.checks.push(match (&info.cudart, driver) {
        (None, _) => Check::pass(
            "CUDA runtime vs driver",
            format!("process {pid} has not loaded libcudart (yet)"),
        ),
        (Some(lib), driver) => {
            let name = lib
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            match (
                versions::cudart_version(&name, &host::dist_infos(lib)),
                driver,
            ) {
                (Some(rt), Some(drv)) => {
                    versions::runtime_vs_driver(rt, drv, &lib.display().to_string())
                }
                (None, _) => Check::unavailable(
                    "CUDA runtime vs driver",
                    format!("cannot tell the version of {}", lib.display()),
                ),
                (_, None) => Check::unavailable(
                    "CUDA runtime vs driver",
                    "NVML did not say the driver's CUDA version",
                ),
            }
        }
    });
    d.checks
        .push(target::alloc_conf(env("PYTORCH_CUDA_ALLOC_CONF")));
    d.checks
        .push(target::dataloader_workers(info.workers, info.imports_torch));
    d.checks.push(match nvml {
        Some(n) => {
            let mut samples = Vec::new();
            host::sample_over(args.trend, 8, |t| {
                let (bytes, on) = nvml_reader::memory_of(n, pid);
                if !on.is_empty() {
                    samples.push((t, bytes));
                }
            });
            target::memory_trend(&samples)
        }
        None => Check::unavailable("GPU memory trend", "NVML is not available"),
    });
}
