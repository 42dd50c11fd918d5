//! Talking to `stallscope agent`'s endpoint: starting an agent, plain and TLS GETs (with
//! basic auth and a client certificate), and a test CA that signs the agent's certificate.
use std::{
    io::Write as _,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject as _};

use super::{simgpu::Sim, spawned::Spawned, stallscope::command};

/// The agent on 127.0.0.1 with the simulated GPU's NVML, and the address it serves on.
pub fn agent(sim: &Sim, nvml: &Path, args: &[&str]) -> (Spawned, String) {
    let proc = Spawned::start(
        command()
            .args([
                "agent",
                "--listen",
                "127.0.0.1:0",
                "--segment",
                "3s",
                "--nvml-lib",
            ])
            .arg(nvml)
            .args(args)
            .env("STALLSCOPE_SIMGPU_STATE", &sim.state),
    );
    let line = proc
        .wait_stderr(Duration::from_secs(30), |l| l.contains("serving http"))
        .unwrap_or_else(|| panic!("the agent never served:\n{}", proc.stderr_so_far()));
    let addr = line
        .split("://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .expect("an address")
        .to_owned();
    (proc, addr)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// An answer's status and body, from its raw bytes.
pub fn parse(raw: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// Reads until the server closes, keeping what came before an error (a TLS peer that closes
/// without close_notify, a reset after the answer).
fn read_all(r: &mut impl std::io::Read) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n) = r.read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    raw
}

/// The request head of a GET over HTTP/1.0 (the server closes after answering).
fn request(addr: &str, path: &str, auth: Option<(&str, &str)>) -> String {
    let auth = auth.map_or_else(String::new, |(u, p)| {
        format!("Authorization: Basic {}\r\n", base64(&format!("{u}:{p}")))
    });
    format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{auth}\r\n")
}

/// A GET over plain HTTP: (status, body).
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    get_as(addr, path, None)
}

/// A GET over plain HTTP with basic auth.
pub fn get_as(addr: &str, path: &str, auth: Option<(&str, &str)>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    s.write_all(request(addr, path, auth).as_bytes()).ok()?;
    parse(&read_all(&mut s))
}

fn base64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A test CA, the agent's certificate for 127.0.0.1 signed by it, and a client's.
pub struct Certs {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

impl Certs {
    /// Writes `ca.crt`, `tls.crt`, `tls.key`, `client.crt` and `client.key` into `dir`.
    pub fn new(dir: &Path) -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "stallscope test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let leaf = |names: Vec<String>| {
            let key = rcgen::KeyPair::generate().unwrap();
            let cert = rcgen::CertificateParams::new(names)
                .unwrap()
                .signed_by(&key, &ca, &ca_key)
                .unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (cert, key) = leaf(vec!["127.0.0.1".into(), "localhost".into()]);
        let (client_cert, client_key) = leaf(vec!["prometheus.test".into()]);
        let certs = Certs {
            ca: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
            client_cert: dir.join("client.crt"),
            client_key: dir.join("client.key"),
        };
        for (path, pem) in [
            (&certs.ca, ca.pem()),
            (&certs.cert, cert),
            (&certs.key, key),
            (&certs.client_cert, client_cert),
            (&certs.client_key, client_key),
        ] {
            std::fs::write(path, pem).unwrap();
        }
        certs
    }

    /// A GET over TLS, trusting only the test CA: `None` when the handshake or the
    /// connection fails.
    pub fn get(
        &self,
        addr: &str,
        path: &str,
        auth: Option<(&str, &str)>,
        with_client_cert: bool,
    ) -> Option<(u16, String)> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&self.ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        #[allow(
            deprecated,
            reason = "the agent's provider, ring, which lacks post-quantum kx"
        )]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if with_client_cert {
            let chain = CertificateDer::pem_file_iter(&self.client_cert)
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(&self.client_key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        } else {
            builder.with_no_client_auth()
        };
        let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h).to_owned();
        let conn =
            rustls::ClientConnection::new(Arc::new(config), ServerName::try_from(host).ok()?)
                .ok()?;
        let sock = TcpStream::connect(addr).ok()?;
        sock.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        let mut tls = rustls::StreamOwned::new(conn, sock);
        tls.write_all(request(addr, path, auth).as_bytes()).ok()?;
        parse(&read_all(&mut tls))
    }
}
