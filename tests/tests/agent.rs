//! `stallscope agent` scraped by a real Prometheus (Debian's `prometheus`, on loopback) while it
//! records stallgen on the simulated GPU, scraping over TLS with basic auth from the README's
//! example web config: the job's injected cause rises in PromQL, every panel
//! query of the Grafana dashboard returns data, the cause's flame graph shows the job's
//! function, a restarted job is picked up again, and a lost NVML is `stallscope_nvml_up 0`,
//! not an exit. A fleet of eight simulated hosts (network namespaces, each with its own GPU,
//! agent and rank of one job) is scraped by one Prometheus, whose query names the straggler.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use common::{
    Scratch,
    endpoint::{Certs, agent, free_port, get, wait_for},
    find_tool, serial,
    simgpu::{Sim, release_dir},
    spawned::Spawned,
};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn stallgen(sim: &Sim, scenario: &str, secs: u32) -> Spawned {
    let job = Spawned::start(
        Command::new(release_dir().join("stallgen"))
            .env("LD_LIBRARY_PATH", &sim.libs)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .args(["--scenario", scenario, "--secs", &secs.to_string()]),
    );
    job.wait_stdout(Duration::from_secs(60), |l| l.starts_with("ready pid="))
        .unwrap_or_else(|| panic!("stallgen never became ready:\n{}", job.stderr_so_far()));
    job
}

/// One sample's value in the agent's own exposition.
fn scraped(addr: &str, series: &str) -> Option<f64> {
    let (status, body) = get(addr, "/metrics")?;
    assert_eq!(status, 200);
    sample(&body, series)
}

/// One sample's value in an exposition.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

struct Prometheus {
    _proc: Spawned,
    addr: String,
}

impl Prometheus {
    /// One server scraping every target each second.
    fn scraping(dir: &Scratch, targets: &[String]) -> Self {
        Self::scraping_with(dir, targets, "")
    }

    /// One server scraping every target each second, with `scrape` added to the job's
    /// config (YAML at the job's indentation).
    fn scraping_with(dir: &Scratch, targets: &[String], scrape: &str) -> Self {
        let bin = find_tool("prometheus").unwrap_or_else(|| {
            panic!("prometheus is missing: apt-get install prometheus, or run `cargo xtask test`")
        });
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: stallscope\n{scrape}    static_configs:\n      - targets: [{}]\n",
                targets
                    .iter()
                    .map(|t| format!("'{t}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
        .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let proc = Spawned::start(
            Command::new(bin)
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("tsdb").display()
                ))
                .arg(format!("--web.listen-address={addr}")),
        );
        wait_for("Prometheus to be ready", Duration::from_secs(60), || {
            get(&addr, "/-/ready").filter(|(s, _)| *s == 200)
        });
        Prometheus { _proc: proc, addr }
    }

    /// An instant query's result vector.
    fn query(&self, q: &str) -> Vec<Value> {
        let (status, body) = get(&self.addr, &format!("/api/v1/query?query={}", encode(q)))
            .unwrap_or_else(|| panic!("no answer from Prometheus for {q}"));
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!(status, 200, "{q}: {body}");
        assert_eq!(v["status"], "success", "{q}: {body}");
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    fn value(&self, q: &str) -> Option<f64> {
        self.query(q)
            .first()
            .and_then(|r| r["value"][1].as_str()?.parse().ok())
    }
}

/// The user and password of `deploy/kubernetes/web-config.yml`'s example hash.
const EXAMPLE_USER: (&str, &str) = ("prometheus", "change-me");

/// The README's example web config, in `dir` with a certificate of the test CA beside it
/// (its relative paths name them): checked by `promtool check web-config` as Prometheus
/// would read it.
fn example_web_config(dir: &Scratch) -> (PathBuf, Certs) {
    let certs = Certs::new(&dir.path);
    let config = dir.join("web-config.yml");
    std::fs::copy(repo().join("deploy/kubernetes/web-config.yml"), &config).unwrap();
    let promtool = find_tool("promtool").expect("promtool (Debian's prometheus package)");
    let out = Command::new(promtool)
        .args(["check", "web-config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "promtool refuses the example web config: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (config, certs)
}

#[test]
fn prometheus_sees_the_injected_cause_rise_and_every_dashboard_panel_has_data() {
    let _serial = serial();
    let sim = Sim::new("agent-prom");
    let dir = Scratch::new("agent-prom");
    let job = stallgen(&sim, "dataloader-cpu", 120);
    let pid = job.pid.to_string();
    // Served as the README says to: over TLS, behind basic auth, from the example web config.
    let (web, certs) = example_web_config(&dir);
    let (_agent, addr) = agent(
        &sim,
        &sim.libs.join("libnvidia-ml.so.1"),
        &[
            "--pid",
            &pid,
            "--flamegraphs",
            "5m",
            "--web.config.file",
            &web.display().to_string(),
        ],
    );
    let fetch = |path: &str| certs.get(&addr, path, Some(EXAMPLE_USER), false);
    let scraped = |series: &str| {
        let (status, body) = fetch("/metrics")?;
        assert_eq!(status, 200, "{body}");
        sample(&body, series)
    };
    // Nobody else gets in: a wrong or missing password is 401, plain HTTP gets no metrics.
    let (status, _) = certs
        .get(&addr, "/metrics", Some(("prometheus", "wrong")), false)
        .expect("an answer over TLS");
    assert_eq!(status, 401, "a wrong password");
    let (status, _) = certs
        .get(&addr, "/metrics", None, false)
        .expect("an answer over TLS");
    assert_eq!(status, 401, "no password");
    let plain = common::endpoint::get_as(&addr, "/metrics", Some(EXAMPLE_USER));
    assert!(
        plain.is_none_or(|(_, body)| !body.contains("stallscope_agent_segments")),
        "plain HTTP to the TLS port got metrics"
    );
    let prom = Prometheus::scraping_with(
        &dir,
        std::slice::from_ref(&addr),
        &format!(
            "    scheme: https\n    tls_config:\n      ca_file: {}\n    basic_auth:\n      \
             username: {}\n      password: {}\n",
            certs.ca.display(),
            EXAMPLE_USER.0,
            EXAMPLE_USER.1
        ),
    );

    let series = r#"sum(stallscope_gpu_seconds_total{state="idle",cause="dataloader_cpu"})"#;
    let first = wait_for(
        "dataloader_cpu seconds in Prometheus",
        Duration::from_secs(90),
        || prom.value(series).filter(|v| *v > 0.0),
    );
    let later = wait_for(
        "dataloader_cpu seconds to rise",
        Duration::from_secs(60),
        || prom.value(series).filter(|v| *v > first),
    );
    assert!(later > first);
    // One recorder follows the job: after its first attach, its segments follow each other
    // with nothing left unrecorded between them.
    let uncovered = || scraped("stallscope_agent_uncovered_seconds_total");
    let segments = || scraped("stallscope_agent_segments_total");
    let (gap, seen) = (uncovered(), segments());
    // The cause's flame graph over the segments kept shows the workers' transform.
    let (status, svg) = fetch("/flamegraph?cause=dataloader_cpu").expect("an answer");
    assert_eq!(status, 200, "{svg}");
    assert!(
        svg.contains("<svg"),
        "not an SVG: {}",
        &svg[..svg.len().min(200)]
    );
    assert!(
        svg.contains("stallgen::work::burn_cpu_ms"),
        "the workers' transform is not in the flame graph"
    );
    let (status, why) = fetch("/flamegraph?cause=bogus").expect("an answer");
    assert_eq!(status, 404);
    assert!(why.contains("dataloader_cpu"), "{why}");

    // Give the 1m rates two segments' worth of points, then every panel must answer.
    std::thread::sleep(Duration::from_secs(8));
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("deploy/grafana/stallscope.json")).unwrap(),
    )
    .unwrap();
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    for p in panels {
        for t in p["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("an expr");
            let got = prom.query(expr);
            assert!(
                !got.is_empty(),
                "panel {:?}: {expr} returned no data",
                p["title"]
            );
        }
    }
    let more = segments();
    assert!(more > seen, "more segments came ({seen:?}, then {more:?})");
    assert_eq!(
        uncovered(),
        gap,
        "time went unrecorded between segments of one job"
    );
    drop(job);
}

#[test]
fn a_restarted_job_is_picked_up_again_and_a_lost_nvml_reads_zero() {
    let _serial = serial();
    let sim = Sim::new("agent-restart");
    let nvml = sim.libs.join("libnvidia-ml.so.1");
    let first = stallgen(&sim, "healthy", 120);
    let (mut agent_proc, addr) = agent(&sim, &nvml, &["--all-gpu-processes"]);
    let memory_of =
        |pid: u32| format!("stallscope_process_gpu_memory_bytes{{gpu=\"0\",pid=\"{pid}\"");
    wait_for(
        "a segment of the first job",
        Duration::from_secs(60),
        || scraped(&addr, "stallscope_agent_segments_total").filter(|n| *n >= 1.0),
    );
    assert!(
        get(&addr, "/metrics")
            .unwrap()
            .1
            .contains(&memory_of(first.pid)),
        "the first job's memory is listed"
    );
    drop(first);
    wait_for(
        "no target once the job is gone",
        Duration::from_secs(60),
        || scraped(&addr, "stallscope_agent_targets").filter(|n| *n == 0.0),
    );
    let done = scraped(&addr, "stallscope_agent_segments_total").unwrap();
    let second = stallgen(&sim, "healthy", 120);
    wait_for(
        "a segment of the restarted job",
        Duration::from_secs(60),
        || scraped(&addr, "stallscope_agent_segments_total").filter(|n| *n > done),
    );
    assert_eq!(scraped(&addr, "stallscope_agent_targets"), Some(1.0));
    assert!(agent_proc.running(), "the agent runs on");
    drop(second);

    // An NVML that cannot be loaded is a 0, and the agent stays up.
    let (mut lost, lost_addr) = agent(
        &sim,
        Path::new("/nonexistent/libnvidia-ml.so.1"),
        &["--pid", "1"],
    );
    assert_eq!(scraped(&lost_addr, "stallscope_nvml_up"), Some(0.0));
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(scraped(&lost_addr, "stallscope_nvml_up"), Some(0.0));
    assert!(lost.running(), "a lost NVML is not an exit");
}

/// A simulated host: a network namespace joined to this one by a veth pair, with its own
/// simulated GPU. Dropping it removes the namespace (and the pair with it).
struct Host {
    netns: String,
    addr: String,
    sim: Sim,
}

/// Runs `ip` with `args`, failing the test with its message.
fn ip(args: &[&str]) {
    let out =
        Command::new(find_tool("ip").expect("iproute2's ip is missing: apt-get install iproute2"))
            .args(args)
            .output()
            .expect("running ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Host {
    fn new(h: usize) -> Self {
        // Before the namespace, so that a failure here leaves none behind.
        let sim = Sim::new(&format!("fleet-{h}"));
        let netns = format!("stallscope-fleet-{}-{h}", std::process::id());
        let veth = format!("sfl{h}p{}", std::process::id() % 100_000);
        Self::remove_left_over(h);
        ip(&["netns", "add", &netns]);
        ip(&[
            "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &netns,
        ]);
        let (ours, theirs) = (format!("10.213.{h}.1"), format!("10.213.{h}.2"));
        ip(&["addr", "add", &format!("{ours}/24"), "dev", &veth]);
        ip(&["link", "set", &veth, "up"]);
        let cidr = format!("{theirs}/24");
        for args in [
            ["addr", "add", cidr.as_str(), "dev", "eth0"].as_slice(),
            &["link", "set", "eth0", "up"],
            &["link", "set", "lo", "up"],
        ] {
            let mut full = vec!["-n", netns.as_str()];
            full.extend_from_slice(args);
            ip(&full);
        }
        Self {
            netns,
            addr: format!("{theirs}:9400"),
            sim,
        }
    }

    /// Host `h`'s namespace (and its veth pair) of an earlier run that was killed: its
    /// address would take this run's host's traffic.
    fn remove_left_over(h: usize) {
        let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
            return;
        };
        let ours = std::process::id();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let name = line.split_whitespace().next().unwrap_or_default();
            let Some(rest) = name.strip_prefix("stallscope-fleet-") else {
                continue;
            };
            let (pid, host) = rest.split_once('-').unwrap_or_default();
            let gone = pid
                .parse::<u32>()
                .is_ok_and(|p| p != ours && !Path::new(&format!("/proc/{p}")).exists());
            if host == h.to_string() && gone {
                let _ = Command::new("ip").args(["netns", "delete", name]).output();
            }
        }
    }

    /// `program` run inside the host's network namespace, on its GPU. Through nsenter, not
    /// `ip netns exec`, which also mounts a sysfs of its own without the cgroup filesystems
    /// (the disk scenario's slow disk is a cgroup's).
    fn command(&self, program: &Path) -> Command {
        let mut c = Command::new(find_tool("nsenter").expect("util-linux's nsenter is missing"));
        c.arg(format!("--net=/run/netns/{}", self.netns))
            .arg("--")
            .arg(program)
            .env("STALLSCOPE_SIMGPU_STATE", &self.sim.state)
            .env("STALLSCOPE_SIMGPU_DEVICES", "1");
        c
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.netns])
            .output();
    }
}

/// Agents stopped as an operator stops them, pass or fail: each ends its recorder and waits
/// for it to remove its probes. Killed, eight agents would leave eight recorders removing
/// theirs, one kernel grace period a probe, well into the next test.
struct Stopping(Vec<Spawned>);

impl std::ops::Deref for Stopping {
    type Target = Vec<Spawned>;
    fn deref(&self) -> &Vec<Spawned> {
        &self.0
    }
}

impl Drop for Stopping {
    fn drop(&mut self) {
        for a in self.0.iter() {
            a.signal(libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.0.iter_mut().any(Spawned::running) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Eight hosts, one rank of one job and one agent each; the last rank reads its batches
/// from a cold disk and the other seven wait for it in the all-reduce. One Prometheus scrapes
/// the eight agents, and one query, over what they export and nothing of ours in between,
/// names the straggler's host and rank: the rank that waited least for the others.
#[test]
fn one_prometheus_query_names_the_straggler_of_a_fleet_of_eight_hosts() {
    const HOSTS: usize = 8;
    let _serial = serial();
    let dir = Scratch::new("fleet");
    let hosts: Vec<Host> = (0..HOSTS).map(Host::new).collect();
    let rendezvous = dir.join("job.rdv");
    let stallgen = release_dir().join("stallgen");
    let jobs: Vec<Spawned> = hosts
        .iter()
        .enumerate()
        .map(|(h, host)| {
            Spawned::start(
                host.command(&stallgen)
                    .env("LD_LIBRARY_PATH", &host.sim.libs)
                    // What torchrun gives each rank, and where the recorder reads it.
                    .env("RANK", h.to_string())
                    .env("WORLD_SIZE", HOSTS.to_string())
                    .env("LOCAL_RANK", "0")
                    .args([
                        "--scenario",
                        "nccl-straggler",
                        "--ranks",
                        "1",
                        "--secs",
                        "600",
                    ])
                    .args([
                        "--world",
                        &HOSTS.to_string(),
                        "--first-rank",
                        &h.to_string(),
                    ])
                    .arg("--rendezvous")
                    .arg(&rendezvous)
                    .arg("--data-dir")
                    .arg(dir.join("data")),
            )
        })
        .collect();
    for (h, job) in jobs.iter().enumerate() {
        job.wait_stdout(Duration::from_secs(180), |l| l.starts_with("ready pid="))
            .unwrap_or_else(|| {
                panic!(
                    "host {h}'s rank never became ready:\n{}",
                    job.stderr_so_far()
                )
            });
    }
    let stallscope = common::stallscope::bin();
    let agents = Stopping(
        hosts
            .iter()
            .map(|host| {
                Spawned::start(
                    host.command(&stallscope)
                        .args(["agent", "--listen", &host.addr, "--segment", "10s"])
                        .args(["--all-gpu-processes", "--nvml-lib"])
                        .arg(host.sim.libs.join("libnvidia-ml.so.1")),
                )
            })
            .collect(),
    );
    for (h, agent) in agents.iter().enumerate() {
        agent
            .wait_stderr(Duration::from_secs(60), |l| l.contains("serving http://"))
            .unwrap_or_else(|| panic!("host {h}'s agent never served:\n{}", agent.stderr_so_far()));
    }
    let targets: Vec<String> = hosts.iter().map(|h| h.addr.clone()).collect();
    let prom = Prometheus::scraping(&dir, &targets);

    // What each host's agent counted and said, and what its job said, for a failure.
    let agents_health = || {
        let series = [
            "stallscope_agent_segments_total",
            "stallscope_agent_segment_failures_total",
            "stallscope_agent_recorded_seconds_total",
            "stallscope_agent_uncovered_seconds_total",
        ]
        .map(|m| {
            format!(
                "{m}: {:?}",
                prom.query(m)
                    .iter()
                    .map(|r| (r["metric"]["instance"].clone(), r["value"][1].clone()))
                    .collect::<Vec<_>>()
            )
        })
        .join("\n");
        let seconds: Vec<String> = prom
            .query("sum by (instance, state, cause) (stallscope_gpu_seconds_total)")
            .iter()
            .map(|r| {
                format!(
                    "{} {} {}: {}",
                    r["metric"]["instance"],
                    r["metric"]["state"],
                    r["metric"]["cause"],
                    r["value"][1]
                )
            })
            .collect();
        let tail = |text: String| -> String {
            let skip = text.chars().count().saturating_sub(600);
            text.chars().skip(skip).collect()
        };
        let said: Vec<String> = agents
            .iter()
            .zip(&jobs)
            .enumerate()
            .map(|(h, (a, j))| {
                format!(
                    "host {h}'s agent said: {}\nits stallgen said: {}",
                    tail(a.stderr_so_far()),
                    tail(j.stderr_so_far())
                )
            })
            .collect();
        format!(
            "{series}\nGPU seconds:\n{}\n{}",
            seconds.join("\n"),
            said.join("\n")
        )
    };
    // Every host's rank, as its agent labels its GPU's time.
    let ranked = r#"count by (instance, rank) (stallscope_gpu_seconds_total{rank!=""})"#;
    let since = Instant::now();
    while prom.query(ranked).len() < HOSTS {
        assert!(
            since.elapsed() < Duration::from_secs(180),
            "timed out waiting for every host's rank in Prometheus: {:?}\n{}",
            prom.query(ranked)
                .iter()
                .map(|r| r["metric"].clone())
                .collect::<Vec<_>>(),
            agents_health()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // Three segments of every host behind each figure. Eight agents on one machine take
    // turns at the kernel: it removes uprobes one RCU-tasks grace period at a time under one
    // mutex (seconds per recorder), and no host's next recorder can attach meanwhile.
    let since = Instant::now();
    while prom.query("stallscope_agent_segments_total >= 3").len() < HOSTS {
        assert!(
            since.elapsed() < Duration::from_secs(600),
            "timed out waiting for three segments of every host:\n{}",
            agents_health()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let failures = prom.query("sum(stallscope_agent_segment_failures_total) > 0");
    assert!(failures.is_empty(), "segments failed:\n{}", agents_health());
    let share = r#"(
        sum by (instance, rank) (rate(stallscope_gpu_seconds_total{rank!="", cause="nccl_wait"}[10m]))
        or 0 * sum by (instance, rank) (rate(stallscope_gpu_seconds_total{rank!=""}[10m]))
      ) / sum by (instance, rank) (rate(stallscope_gpu_seconds_total{rank!=""}[10m]))"#;
    let value = |r: &Value| -> f64 {
        r["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    // A rate needs two scrapes with a segment's report between them. On a loaded machine a
    // scrape can time out (its timeout is the 1 s interval) and leave a rank's series flat in
    // Prometheus (0/0: NaN) though its agent reported: the agents keep reporting every 10 s,
    // so every share becomes a number.
    let since = Instant::now();
    loop {
        let shares = prom.query(share);
        if shares.len() >= HOSTS && shares.iter().all(|r| value(r).is_finite()) {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(600),
            "timed out waiting for every rank's share to be a number: {shares:?}\nscrapes: {:?}\n{}",
            prom.query("up")
                .iter()
                .map(|r| (r["metric"]["instance"].clone(), r["value"][1].clone()))
                .collect::<Vec<_>>(),
            agents_health()
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let straggler = prom.query(&format!("bottomk(1, {share})"));
    let shares = prom.query(share);
    let named = |r: &Value| {
        (
            r["metric"]["instance"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            r["metric"]["rank"].as_str().unwrap_or_default().to_owned(),
        )
    };
    let slow = HOSTS - 1;
    assert_eq!(
        straggler.iter().map(named).collect::<Vec<_>>(),
        [(hosts[slow].addr.clone(), slow.to_string())],
        "the straggler is host {slow}'s rank {slow}; each rank's share of its GPU time waiting in NCCL: {shares:?}\n{}",
        agents_health()
    );
    // And it is named because the others waited for it: each at least twice as long.
    let theirs = value(&straggler[0]);
    for r in shares.iter().filter(|r| named(r).1 != slow.to_string()) {
        assert!(
            value(r) >= 0.05 && value(r) >= 2.0 * theirs,
            "rank {:?} waited {:.3} of its GPU time, the straggler {theirs:.3}: {shares:?}\n{}",
            named(r),
            value(r),
            agents_health()
        );
    }
    // What held it up, from the same series.
    let cause = prom.query(&format!(
        r#"topk(1, sum by (cause) (rate(stallscope_gpu_seconds_total{{instance="{}", state=~"idle|waiting", cause!~"nccl_wait|unattributed|unknown"}}[10m])))"#,
        hosts[slow].addr
    ));
    assert_eq!(
        cause.first().map(|r| r["metric"]["cause"].clone()),
        Some(Value::from("disk")),
        "{cause:?}"
    );
    println!(
        "fleet: straggler {:?}; shares waiting in NCCL {:?}\n{}",
        straggler.iter().map(named).collect::<Vec<_>>(),
        shares
            .iter()
            .map(|r| (named(r), value(r)))
            .collect::<Vec<_>>(),
        agents_health()
    );
    drop(agents);
    drop(jobs);
}
