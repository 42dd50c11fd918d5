//! `stallscope agent`'s endpoint against the clients a port open to a cluster meets: idle and
//! slow connections that must not delay a scrape, fifty scrapers at once, oversized and
//! malformed requests, and a web config asking for client certificates. The agent watches a
//! simulated GPU with no job on it, so every scrape reads NVML and renders the exposition.
#[allow(
    dead_code,
    reason = "each test binary uses its own part of the shared helpers"
)]
mod common;

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::{
    Scratch,
    endpoint::{Certs, agent, get, parse},
    serial,
    simgpu::Sim,
    spawned::Spawned,
    stallscope::command,
};

/// The agent, watching every process on a simulated GPU that has none.
fn quiet_agent(sim: &Sim, args: &[&str]) -> (Spawned, String) {
    let mut all = vec!["--all-gpu-processes"];
    all.extend_from_slice(args);
    agent(sim, &sim.libs.join("libnvidia-ml.so.1"), &all)
}

/// A scrape that must succeed: the exposition names the simulated GPU.
fn scrape_ok(addr: &str) -> Result<(), String> {
    match get(addr, "/metrics") {
        Some((200, body)) if body.contains("stallscope_nvml_up 1") => Ok(()),
        Some((status, body)) => Err(format!("{status}: {}", &body[..body.len().min(300)])),
        None => Err("no answer".into()),
    }
}

/// How long until the agent closes `s` (reads end or reset), up to `limit`.
fn closed_within(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut buf = [0u8; 1024];
    while start.elapsed() < limit {
        s.set_read_timeout(Some(Duration::from_millis(500))).ok()?;
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Some(start.elapsed()),
        }
    }
    None
}

/// Resident and peak memory of a process, in bytes, from /proc/PID/status.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/status: {e}"));
    let kib = |key: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
    };
    (kib("VmRSS:") * 1024, kib("VmHWM:") * 1024)
}

#[test]
fn idle_and_slow_connections_never_delay_a_scrape() {
    let _serial = serial();
    let sim = Sim::new("endpoint-slow");
    let (mut agent_proc, addr) = quiet_agent(&sim, &[]);

    let idle: Vec<TcpStream> = (0..200)
        .map(|i| TcpStream::connect(&addr).unwrap_or_else(|e| panic!("idle connection {i}: {e}")))
        .collect();
    // A client that sends its request head one byte a second and notes when it is cut off.
    let slow_started = Arc::new(AtomicBool::new(false));
    let slow = {
        let (addr, started) = (addr.clone(), slow_started.clone());
        std::thread::spawn(move || -> Result<Duration, String> {
            let mut s = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
            s.set_read_timeout(Some(Duration::from_secs(1)))
                .map_err(|e| e.to_string())?;
            let head = format!(
                "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nX-Pad: {}\r\n\r\n",
                "a".repeat(64)
            );
            let start = Instant::now();
            let mut buf = [0u8; 1024];
            for b in head.bytes() {
                if s.write_all(&[b]).is_err() {
                    return Ok(start.elapsed());
                }
                started.store(true, Ordering::SeqCst);
                match s.read(&mut buf) {
                    Ok(0) => return Ok(start.elapsed()),
                    Ok(_) => return Err("an answer to a request it never finished".into()),
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    Err(_) => return Ok(start.elapsed()),
                }
            }
            Err(format!(
                "sent its whole head over {:?} without being cut off",
                start.elapsed()
            ))
        })
    };
    while !slow_started.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
    }

    // With all of them open, ten scrapes in a row each answer within a second.
    let mut took = Vec::new();
    for i in 0..10 {
        let start = Instant::now();
        scrape_ok(&addr).unwrap_or_else(|e| panic!("scrape {i} with 201 slow clients open: {e}"));
        took.push(start.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    let slowest = took.iter().max().unwrap();
    eprintln!("ten scrapes beside 200 idle connections and a slow one: slowest {slowest:?}");
    assert!(
        *slowest < Duration::from_secs(1),
        "a scrape took {slowest:?} beside idle connections: {took:?}"
    );
    assert!(
        !slow.is_finished(),
        "the slow client was cut off before the scrapes ended"
    );

    // None of them holds a connection for ever: the agent bounds the time to send a head.
    let slow_cut = slow
        .join()
        .unwrap()
        .unwrap_or_else(|e| panic!("slow client: {e}"));
    assert!(
        slow_cut < Duration::from_secs(30),
        "the slow client was cut off only after {slow_cut:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, mut s) in idle.into_iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            closed_within(&mut s, left.max(Duration::from_millis(500))).is_some(),
            "idle connection {i} still open 30 s after it was opened"
        );
    }
    scrape_ok(&addr).expect("a scrape after the idle connections were closed");
    assert!(
        agent_proc.running(),
        "the agent ended: {}",
        agent_proc.stderr_so_far()
    );
}

#[test]
fn fifty_scrapers_at_once_get_every_answer_and_memory_stays_bounded() {
    let _serial = serial();
    let sim = Sim::new("endpoint-many");
    let (mut agent_proc, addr) = quiet_agent(&sim, &[]);
    let pid = agent_proc.pid;
    scrape_ok(&addr).expect("a first scrape");

    const RUN: Duration = Duration::from_secs(30);
    let start = Instant::now();
    let scrapers: Vec<_> = (0..50)
        .map(|_| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let (mut ok, mut errors) = (0u32, Vec::new());
                while start.elapsed() < RUN {
                    match scrape_ok(&addr) {
                        Ok(()) => ok += 1,
                        Err(e) => errors.push(e),
                    }
                }
                (ok, errors)
            })
        })
        .collect();
    // Memory once the scrapers have warmed every buffer, then at the end.
    std::thread::sleep(Duration::from_secs(5));
    let (early, _) = rss(pid);
    let mut late = early;
    while start.elapsed() < RUN {
        std::thread::sleep(Duration::from_secs(1));
        late = late.max(rss(pid).0);
    }
    let (mut answered, mut errors) = (0u32, Vec::new());
    for s in scrapers {
        let (ok, e) = s.join().unwrap();
        assert!(ok > 0, "a scraper got no answer in {RUN:?}: {e:?}");
        answered += ok;
        errors.extend(e);
    }
    let (_, peak) = rss(pid);
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "{answered} scrapes by 50 scrapers in {RUN:?}, {} errors; agent RSS {:.1} MiB after 5 s, \
         at most {:.1} MiB later, peak {:.1} MiB",
        errors.len(),
        mib(early),
        mib(late),
        mib(peak)
    );
    assert!(
        errors.is_empty(),
        "{} failed scrapes: {:?}",
        errors.len(),
        &errors[..errors.len().min(5)]
    );
    assert!(
        late <= early + early / 2 + (8 << 20),
        "the agent's RSS grew from {:.1} MiB to {:.1} MiB under steady scraping",
        mib(early),
        mib(late)
    );
    assert!(
        peak < 256 << 20,
        "the agent's peak RSS is {:.1} MiB",
        mib(peak)
    );
    assert!(
        agent_proc.running(),
        "the agent ended: {}",
        agent_proc.stderr_so_far()
    );
}

/// Sends `raw` (as much of it as the agent takes) and reads the answer's status.
fn status_of(addr: &str, raw: &[u8]) -> Option<u16> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(15))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(15))).ok()?;
    // The agent may answer and close before it has read all of an oversized head.
    let _ = s.write_all(raw);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    parse(&got).map(|(status, _)| status)
}

#[test]
fn oversized_and_malformed_requests_get_their_status_and_the_agent_keeps_serving() {
    let _serial = serial();
    let sim = Sim::new("endpoint-bad");
    let (mut agent_proc, addr) = quiet_agent(&sim, &[]);
    let big = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nX-Big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let many = format!(
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{}\r\n",
        (0..2000)
            .map(|i| format!("X-H{i}: {i}\r\n"))
            .collect::<String>()
    );
    let cases: [(&str, Vec<u8>, u16); 7] = [
        ("a 64 KiB header", big.into_bytes(), 431),
        ("2000 headers", many.into_bytes(), 431),
        ("a garbage request line", b"HELLO THERE\r\n\r\n".to_vec(), 400),
        ("binary garbage", b"\x16\x03\x01\x00\xff\xfe\r\n\r\n".to_vec(), 400),
        (
            "a request line with no version",
            b"GET /metrics\r\n\r\n".to_vec(),
            400,
        ),
        (
            "a POST",
            format!("POST /metrics HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                .into_bytes(),
            405,
        ),
        (
            "an unknown path",
            format!("GET /secrets HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").into_bytes(),
            404,
        ),
    ];
    for (what, raw, want) in cases {
        let got = status_of(&addr, &raw);
        assert_eq!(got, Some(want), "{what}");
        scrape_ok(&addr).unwrap_or_else(|e| panic!("a scrape after {what}: {e}"));
    }
    assert!(
        agent_proc.running(),
        "the agent ended: {}",
        agent_proc.stderr_so_far()
    );
}

#[test]
fn client_certificates_are_required_when_the_web_config_says_so_and_a_bad_file_is_refused() {
    let _serial = serial();
    let sim = Sim::new("endpoint-mtls");
    let dir = Scratch::new("endpoint-mtls");
    let certs = Certs::new(&dir.path);
    // Relative paths, read against the file's own folder.
    let web = dir.join("web.yml");
    std::fs::write(
        &web,
        "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  client_ca_file: ca.crt\n  \
         client_auth_type: RequireAndVerifyClientCert\n  min_version: TLS13\n\
         http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n",
    )
    .unwrap();
    let (mut agent_proc, addr) =
        quiet_agent(&sim, &["--web.config.file", &web.display().to_string()]);
    let with_cert = certs.get(&addr, "/metrics", None, true);
    assert!(
        matches!(&with_cert, Some((200, body)) if body.contains("stallscope_nvml_up 1")),
        "a client with a certificate of the CA: {with_cert:?}"
    );
    let without = certs.get(&addr, "/metrics", None, false);
    assert!(
        without.is_none(),
        "a client without a certificate got an answer: {without:?}"
    );
    assert!(
        get(&addr, "/metrics").is_none_or(|(_, b)| !b.contains("stallscope_nvml_up")),
        "plain HTTP got metrics"
    );
    assert!(
        agent_proc.running(),
        "the agent ended: {}",
        agent_proc.stderr_so_far()
    );
    drop(agent_proc);

    // A bad file stops the agent before it serves, naming the file and the key.
    for (body, key) in [
        ("tls_server_config:\n  cert_file: tls.crt\n", "key_file"),
        (
            "basic_auth_users:\n  alice: not-a-bcrypt-hash\n",
            "basic_auth_users",
        ),
        (
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: nowhere.key\n",
            "nowhere.key",
        ),
        (
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
            "cipher_suites",
        ),
        ("tls_config:\n  cert_file: tls.crt\n", "tls_config"),
    ] {
        let bad = dir.join("bad.yml");
        std::fs::write(&bad, body).unwrap();
        let out = command()
            .args([
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--all-gpu-processes",
                "--nvml-lib",
            ])
            .arg(sim.libs.join("libnvidia-ml.so.1"))
            .arg("--web.config.file")
            .arg(&bad)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the agent took {body:?}: {stderr}");
        assert!(
            stderr.contains(&bad.display().to_string()) && stderr.contains(key),
            "the error for {body:?} names neither the file nor {key}: {stderr}"
        );
        assert!(
            !stderr.contains("serving"),
            "served with {body:?}: {stderr}"
        );
    }
}
