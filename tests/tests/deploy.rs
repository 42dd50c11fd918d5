//! What `deploy/` holds, as the tools that consume it read it: the alert rules as Prometheus
//! does (`promtool check rules` for their syntax, `promtool test rules` for each alert firing
//! and staying quiet on the series of `alerts_test.yml`); the DaemonSet against Kubernetes'
//! schema (`kubernetes-validate --strict`); the Dockerfile through hadolint; and the image,
//! built from the Dockerfile with podman, running the agent with the DaemonSet's arguments,
//! privileges, host PID namespace and host mounts, against a job on the host.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn deploy() -> PathBuf {
    repo().join("deploy/prometheus")
}

/// Debian's `prometheus` package puts promtool in /usr/bin; `cargo xtask test` installs it.
fn promtool() -> PathBuf {
    common::find_tool("promtool").unwrap_or_else(|| {
        panic!("promtool is missing: apt-get install prometheus, or run `cargo xtask test`")
    })
}

fn run(args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(deploy())
        .output()
        .expect("runs promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn the_alert_rules_are_valid_prometheus_rules() {
    let out = run(&["check", "rules", "alerts.yml"]);
    assert!(out.contains("SUCCESS: 6 rules found"), "{out}");
}

#[test]
fn every_alert_fires_on_its_case_and_stays_quiet_on_the_others() {
    let out = run(&["test", "rules", "alerts_test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
    // Each alert is exercised: a rule nobody tests could be anything.
    let rules = std::fs::read_to_string(deploy().join("alerts.yml")).unwrap();
    let tests = std::fs::read_to_string(deploy().join("alerts_test.yml")).unwrap();
    let alerts: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: "))
        .collect();
    assert_eq!(alerts.len(), 6, "{alerts:?}");
    for a in alerts {
        let firing = tests
            .split("alertname: ")
            .skip(1)
            .filter(|t| t.starts_with(a) && t.contains("exp_labels"))
            .count();
        assert!(firing > 0, "{a} has no firing case in alerts_test.yml");
    }
}

/// A tool from the virtualenv `cargo xtask test` makes (kubernetes-validate, hadolint).
fn venv_tool(name: &str) -> PathBuf {
    let python = std::env::var_os("STALLSCOPE_VIEWER_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
            Path::new(&home).join(".cache/stallscope/viewer-venv/bin/python")
        });
    let tool = python.with_file_name(name);
    assert!(
        tool.is_file(),
        "{} is missing: run `cargo xtask test` (it installs {name} into the tools' virtualenv)",
        tool.display()
    );
    tool
}

/// Runs `cmd`, returning its output; fails the test, with the output, when it fails.
fn ran(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what} did not run: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{what} failed:\n{text}");
    text
}

const DAEMONSET: &str = "deploy/kubernetes/daemonset.yaml";
const DOCKERFILE: &str = "deploy/Dockerfile";

#[test]
fn the_daemonset_is_valid_against_the_kubernetes_schema() {
    let out = ran(
        Command::new(venv_tool("kubernetes-validate"))
            .arg("--strict")
            .arg(DAEMONSET)
            .current_dir(repo()),
        "kubernetes-validate",
    );
    assert!(
        out.contains("passed for resource daemonset/stallscope-agent"),
        "{out}"
    );
}

#[test]
fn the_dockerfile_passes_hadolint() {
    ran(
        Command::new(venv_tool("hadolint"))
            .arg(DOCKERFILE)
            .current_dir(repo()),
        "hadolint",
    );
}

/// The DaemonSet's one container, and its pod spec.
fn daemonset() -> (Yaml, Yaml) {
    let text = std::fs::read_to_string(repo().join(DAEMONSET)).unwrap();
    let doc = YamlLoader::load_from_str(&text)
        .unwrap_or_else(|e| panic!("{DAEMONSET}: {e}"))
        .remove(0);
    let template = doc["spec"]["template"].clone();
    let container = template["spec"]["containers"][0].clone();
    (template, container)
}

fn strings(y: &Yaml) -> Vec<String> {
    y.as_vec()
        .map(|v| {
            v.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The image's default command, from the Dockerfile's `CMD [...]`.
fn dockerfile_cmd() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join(DOCKERFILE)).unwrap();
    let cmd = text
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("CMD "))
        .expect("the Dockerfile has a CMD");
    serde_json::from_str(cmd).unwrap_or_else(|e| panic!("CMD {cmd}: {e}"))
}

#[test]
fn the_daemonset_scrape_annotations_and_probe_name_the_agents_port() {
    let (template, container) = daemonset();
    let args = strings(&container["args"]);
    assert_eq!(
        args,
        dockerfile_cmd(),
        "the DaemonSet runs the image's default command"
    );
    let listen = args
        .iter()
        .skip_while(|a| *a != "--listen")
        .nth(1)
        .expect("the agent listens on an address");
    let port = listen.rsplit(':').next().unwrap();
    let notes = &template["metadata"]["annotations"];
    assert_eq!(notes["prometheus.io/scrape"].as_str(), Some("true"));
    assert_eq!(notes["prometheus.io/port"].as_str(), Some(port));
    assert_eq!(notes["prometheus.io/path"].as_str(), Some("/metrics"));
    let ports = container["ports"].as_vec().expect("ports");
    assert_eq!(
        ports[0]["containerPort"]
            .as_i64()
            .map(|p| p.to_string())
            .as_deref(),
        Some(port)
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["path"].as_str(),
        Some("/metrics")
    );
}

/// podman, with what these machines need: runc (crun refuses the hybrid cgroup layout here),
/// and resource limits no higher than this process's (root here lacks CAP_SYS_RESOURCE, and
/// podman's defaults are higher).
fn podman() -> Command {
    let podman = common::find_tool("podman").unwrap_or_else(|| {
        panic!("podman is missing: apt-get install podman runc, or run `cargo xtask test`")
    });
    let mut cmd = Command::new(podman);
    cmd.args(["--runtime", "runc"]);
    cmd
}

fn limits() -> Vec<String> {
    let hard = |resource| {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: a valid out-pointer.
        unsafe { libc::getrlimit(resource, &mut r) };
        r.rlim_max
    };
    let nofile = hard(libc::RLIMIT_NOFILE).min(16384);
    let nproc = hard(libc::RLIMIT_NPROC).min(4096);
    vec![
        "--ulimit".into(),
        format!("nofile={nofile}:{nofile}"),
        "--ulimit".into(),
        format!("nproc={nproc}:{nproc}"),
    ]
}

/// Removes the container when the test ends, however it ends.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "5", &self.0]).output();
    }
}

/// Removes the test's image, and the intermediate images its build left, when the test ends.
/// Only images that were not dangling before the build are removed: others on the host are
/// not ours to prune.
struct Image {
    name: String,
    dangling_before: Vec<String>,
}

impl Image {
    fn new(name: String) -> Image {
        Image {
            name,
            dangling_before: dangling_images(),
        }
    }
}

fn dangling_images() -> Vec<String> {
    podman()
        .args([
            "images",
            "-a",
            "-q",
            "--no-trunc",
            "--filter",
            "dangling=true",
        ])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = podman().args(["rmi", "-f", &self.name]).output();
        // Removing a layer's child leaves its parent dangling: a round per layer of the build.
        let mut last = Vec::new();
        for _ in 0..64 {
            let ours: Vec<String> = dangling_images()
                .into_iter()
                .filter(|id| !self.dangling_before.contains(id))
                .collect();
            if ours.is_empty() || ours == last {
                break;
            }
            let _ = podman().args(["rmi", "-f"]).args(&ours).output();
            last = ours;
        }
    }
}

fn scrape(port: &str) -> Option<String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().ok()?)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    (text.split_whitespace().nth(1) == Some("200"))
        .then(|| text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()))
        .flatten()
}

fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[test]
fn the_image_runs_the_agent_as_the_daemonset_does() {
    let _serial = common::serial();
    assert!(
        repo().join("target/release/stallscope").is_file(),
        "the image takes target/release/stallscope: run `cargo xtask build`"
    );
    let image = format!("localhost/stallscope-test:{}", std::process::id());
    let _image = Image::new(image.clone());
    ran(
        podman()
            // (`--layers=false` would leave no intermediate images, but podman 4.3 then fails
            // with "identifier is not an image" after tagging: they are pruned instead.)
            .args(["build", "--pull=never", "--network", "host"])
            .args(limits())
            .args([
                "--build-arg",
                "BINARY=prebuilt",
                "-f",
                DOCKERFILE,
                "-t",
                &image,
                ".",
            ])
            .current_dir(repo()),
        "podman build (the base image comes from `cargo xtask test`)",
    );
    let (template, container) = daemonset();
    let spec = &template["spec"];
    let args = strings(&container["args"]);
    let port = args
        .iter()
        .skip_while(|a| *a != "--listen")
        .nth(1)
        .and_then(|l| l.rsplit(':').next())
        .expect("a --listen port")
        .to_owned();

    // A job on the host, on the simulated GPU, whose NVML the container gets as the NVIDIA
    // toolkit would inject the driver's.
    let sim = common::simgpu::Sim::new("deploy");
    let job = common::spawned::Spawned::start(
        Command::new(common::simgpu::release_dir().join("stallgen"))
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["--scenario", "dataloader-cpu", "--secs", "120"]),
    );
    job.wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("stallgen never became ready:\n{}", job.stderr_so_far()));

    let name = format!("stallscope-deploy-test-{}", std::process::id());
    let mut run = podman();
    run.args(["run", "-d", "--name", &name])
        .args(limits())
        // The pod's network is Kubernetes'; here the host's, to scrape it on loopback.
        .args(["--network", "host"]);
    if spec["hostPID"].as_bool() == Some(true) {
        run.arg("--pid=host");
    }
    let security = &container["securityContext"];
    if security["privileged"].as_bool() == Some(true) {
        run.arg("--privileged");
    }
    for cap in strings(&security["capabilities"]["add"]) {
        run.args(["--cap-add", &cap]);
    }
    let volumes = spec["volumes"].as_vec().expect("volumes");
    for m in container["volumeMounts"].as_vec().expect("volumeMounts") {
        let vol = volumes
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap_or_else(|| panic!("no volume for {m:?}"));
        // An optional Secret (the web config) is an empty folder until it is created.
        if vol["secret"]["optional"].as_bool() == Some(true) {
            continue;
        }
        let host = vol["hostPath"]["path"].as_str().expect("a hostPath");
        let mut spec = format!("{host}:{}", m["mountPath"].as_str().expect("a mountPath"));
        if m["readOnly"].as_bool() == Some(true) {
            spec += ":ro";
        }
        run.args(["-v", &spec]);
    }
    for e in container["env"].as_vec().into_iter().flatten() {
        run.args([
            "-e",
            &format!(
                "{}={}",
                e["name"].as_str().unwrap(),
                e["value"].as_str().unwrap()
            ),
        ]);
    }
    let state = sim.state.display().to_string();
    let libs = sim.libs.display().to_string();
    run.args([
        "-v",
        &format!("{state}:{state}"),
        "-v",
        &format!("{libs}:{libs}:ro"),
    ])
    .args(["-e", &format!("STALLSCOPE_SIMGPU_STATE={state}")])
    .args([
        "-e",
        &format!("STALLSCOPE_NVML_LIB={libs}/libnvidia-ml.so.1"),
    ])
    .arg(&image)
    .args(&args);
    ran(&mut run, "podman run");
    let _container = Container(name.clone());
    let logs = || {
        podman()
            .args(["logs", &name])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stderr).into_owned()
                    + &String::from_utf8_lossy(&o.stdout)
            })
            .unwrap_or_default()
    };

    // Ready as the probe asks, then a segment of the host's job, found through NVML and the
    // host's PID namespace.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let text = loop {
        if let Some(t) = scrape(&port)
            && value(&t, "stallscope_agent_segments_total").is_some_and(|n| n >= 1.0)
        {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no segment from the agent in the container within 90 s:\n{}",
            logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    assert_eq!(
        value(&text, "stallscope_agent_targets"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(value(&text, "stallscope_nvml_up"), Some(1.0), "{text}");
    assert!(
        text.contains(&format!("pid=\"{}\"", job.pid)),
        "the job's GPU memory is listed under its host PID:\n{text}"
    );
    let gpu_seconds: f64 = text
        .lines()
        .filter(|l| l.starts_with("stallscope_gpu_seconds_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(gpu_seconds > 0.0, "the GPU's seconds are counted:\n{text}");
    assert_eq!(
        value(&text, "stallscope_agent_segment_failures_total"),
        Some(0.0),
        "{}",
        logs()
    );
    drop(_container);

    // The same image as a one-off CLI, as the README shows it: the host's PID namespace,
    // privileged, the host's /sys/kernel (BTF, tracefs, debugfs); the simulated GPU's NVML
    // mounted in as `--gpus all` would mount the driver's.
    let out = podman()
        .args(["run", "--rm"])
        .args(limits())
        .args([
            "--pid=host",
            "--privileged",
            "-v",
            "/sys/kernel:/sys/kernel",
        ])
        // A recorder needs no network.
        .args(["--network", "none"])
        .args([
            "-v",
            &format!("{state}:{state}"),
            "-v",
            &format!("{libs}:{libs}:ro"),
        ])
        .args(["-e", &format!("STALLSCOPE_SIMGPU_STATE={state}")])
        .arg(&image)
        .args([
            "record",
            "--pid",
            &job.pid.to_string(),
            "-d",
            "4s",
            "--json",
        ])
        .args([
            "-o",
            "/tmp/run.rec",
            "--nvml-lib",
            &format!("{libs}/libnvidia-ml.so.1"),
        ])
        .output()
        .expect("podman run");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "record in the container failed:\n{stderr}"
    );
    let report = common::stallscope::parse_report(&stdout);
    assert!(
        report["threads"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["tid"] == job.pid)),
        "the host job's main thread is not in the container's report:\n{stderr}"
    );
    let idle = &common::simgpu::gpu(&report)["idle_by_cause"];
    assert!(
        idle["dataloader_cpu"].as_u64().is_some_and(|ns| ns > 0),
        "the container's record does not see the job's data-loading stall: {idle}\n{stderr}"
    );
}
