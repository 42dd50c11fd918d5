//! `--web.config.file`: TLS, client certificates, basic-auth users and response headers, in
//! the Prometheus exporter-toolkit's format, so that the file node_exporter or dcgm-exporter
//! already run with serves the agent too.
//!
//! Relative paths resolve against the file's own folder, as exporter-toolkit resolves them. A
//! file that cannot be served as written is refused at start, naming the file and the key:
//! an agent that quietly serves less protection than its file asks for would be worse.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, bail};
use rustls::{
    RootCertStore, ServerConfig,
    server::{WebPkiClientVerifier, danger::ClientCertVerifier},
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
use serde::Deserialize;

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    #[serde(default)]
    basic_auth_users: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    /// The certificate and key inline, as PEM.
    cert: Option<String>,
    key: Option<String>,
    client_ca_file: Option<PathBuf>,
    client_auth_type: Option<String>,
    min_version: Option<String>,
    max_version: Option<String>,
    #[serde(default)]
    cipher_suites: Vec<String>,
    #[serde(default)]
    curve_preferences: Vec<String>,
    /// Go ignores it since 1.18; so does rustls, which always prefers its own order.
    #[allow(dead_code, reason = "accepted for files written for Go exporters")]
    prefer_server_cipher_suites: Option<bool>,
    #[serde(default)]
    client_allowed_sans: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    /// The agent speaks HTTP/1.1, which every Prometheus scrapes; the key is accepted so that
    /// an exporter's file reads.
    #[allow(dead_code, reason = "accepted for files written for Go exporters")]
    http2: Option<bool>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

/// What the endpoint serves with: TLS when configured, the users allowed in (bcrypt hashes;
/// none: no authentication), and headers added to every answer.
#[derive(Clone, Default)]
pub struct WebConfig {
    pub tls: Option<Arc<ServerConfig>>,
    pub users: BTreeMap<String, String>,
    pub headers: Vec<(String, String)>,
}

impl std::fmt::Debug for WebConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebConfig")
            .field("tls", &self.tls.is_some())
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .field("headers", &self.headers)
            .finish()
    }
}

/// The headers exporter-toolkit allows, with the values it allows (`None`: any).
const HEADERS: [(&str, Option<&[&str]>); 5] = [
    ("Strict-Transport-Security", None),
    ("X-Content-Type-Options", Some(&["nosniff"])),
    ("X-Frame-Options", Some(&["deny", "sameorigin"])),
    ("X-XSS-Protection", None),
    ("Content-Security-Policy", None),
];

/// Reads and checks `path`, and loads the certificates it names.
pub fn load(path: &Path) -> anyhow::Result<WebConfig> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("web config {}: cannot read it", path.display()))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    build(&text, dir).with_context(|| format!("web config {}", path.display()))
}

fn parse(text: &str) -> anyhow::Result<File> {
    if text.trim().is_empty() {
        return Ok(File::default());
    }
    serde_norway::from_str(text).map_err(|e| anyhow::anyhow!("{e}"))
}

/// The config of `text`, its relative paths read from `dir`.
fn build(text: &str, dir: &Path) -> anyhow::Result<WebConfig> {
    let file = parse(text)?;
    for (user, hash) in &file.basic_auth_users {
        hash.parse::<bcrypt::HashParts>().map_err(|e| {
            anyhow::anyhow!("basic_auth_users.{user}: not a bcrypt hash ({e}); make one with `htpasswd -nBC 10 {user}`")
        })?;
    }
    let headers = file
        .http_server_config
        .map(|h| h.headers)
        .unwrap_or_default()
        .into_iter()
        .map(|(name, value)| header(&name, value))
        .collect::<anyhow::Result<_>>()?;
    let tls = file
        .tls_server_config
        .map(|t| tls(t, dir).context("tls_server_config"))
        .transpose()?;
    Ok(WebConfig {
        tls,
        users: file.basic_auth_users,
        headers,
    })
}

fn header(name: &str, value: String) -> anyhow::Result<(String, String)> {
    let Some((canonical, allowed)) = HEADERS.iter().find(|(h, _)| h.eq_ignore_ascii_case(name))
    else {
        bail!(
            "http_server_config.headers.{name}: not a header the agent sets (these are: {})",
            HEADERS.map(|h| h.0).join(", ")
        );
    };
    if let Some(allowed) = allowed
        && !allowed.iter().any(|a| a.eq_ignore_ascii_case(&value))
    {
        bail!(
            "http_server_config.headers.{name}: {value:?} is not one of {}",
            allowed.join(", ")
        );
    }
    if value.chars().any(|c| c.is_control()) {
        bail!("http_server_config.headers.{name}: the value has a control character");
    }
    Ok(((*canonical).to_owned(), value))
}

fn version(key: &str, name: Option<&str>, default: &str) -> anyhow::Result<u8> {
    match name.unwrap_or(default) {
        // rustls speaks TLS 1.2 and 1.3 only: a floor under 1.2 is met by 1.2.
        "TLS10" | "TLS11" | "TLS12" => Ok(12),
        "TLS13" => Ok(13),
        other => bail!("{key}: {other:?} is not one of TLS10, TLS11, TLS12, TLS13"),
    }
}

/// ring's suites and key exchanges. (rustls deprecates ring's provider for lacking the
/// post-quantum key exchange, which only aws-lc-rs has; aws-lc-rs needs cmake and a C
/// toolchain to build, and Prometheus's Go client negotiates X25519 with either.)
#[allow(
    deprecated,
    reason = "see above: ring builds everywhere the agent does"
)]
fn crypto() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The TLS server of `t`.
fn tls(t: TlsFile, dir: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    if !t.cipher_suites.is_empty() {
        bail!(
            "cipher_suites: not supported; the agent's TLS (rustls) offers only modern AEAD suites: remove the key"
        );
    }
    if !t.curve_preferences.is_empty() {
        bail!(
            "curve_preferences: not supported; rustls chooses among X25519 and the NIST curves: remove the key"
        );
    }
    if !t.client_allowed_sans.is_empty() {
        bail!(
            "client_allowed_sans: not supported; trust a CA that signs only the allowed clients instead"
        );
    }
    let resolve = |p: &Path| dir.join(p);
    let certs: Vec<CertificateDer<'static>> = match (&t.cert_file, &t.cert) {
        (Some(_), Some(_)) => bail!("cert_file and cert: give one"),
        (Some(f), None) => {
            let f = resolve(f);
            CertificateDer::pem_file_iter(&f)
                .and_then(Iterator::collect)
                .with_context(|| format!("cert_file: cannot read {}", f.display()))?
        }
        (None, Some(pem)) => CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<_, _>>()
            .context("cert: not PEM")?,
        (None, None) => bail!("cert_file: missing (the server's certificate)"),
    };
    if certs.is_empty() {
        bail!("cert_file: no certificate in it");
    }
    let key: PrivateKeyDer<'static> = match (&t.key_file, &t.key) {
        (Some(_), Some(_)) => bail!("key_file and key: give one"),
        (Some(f), None) => {
            let f = resolve(f);
            PrivateKeyDer::from_pem_file(&f).with_context(|| {
                format!("key_file: cannot read a private key from {}", f.display())
            })?
        }
        (None, Some(pem)) => {
            PrivateKeyDer::from_pem_slice(pem.as_bytes()).context("key: not a PEM private key")?
        }
        (None, None) => bail!("key_file: missing (the certificate's private key)"),
    };
    let low = version("min_version", t.min_version.as_deref(), "TLS12")?;
    let high = version("max_version", t.max_version.as_deref(), "TLS13")?;
    if low > high {
        bail!("min_version is above max_version");
    }
    let versions: Vec<&'static rustls::SupportedProtocolVersion> =
        [(12, &rustls::version::TLS12), (13, &rustls::version::TLS13)]
            .into_iter()
            .filter(|(v, _)| (low..=high).contains(v))
            .map(|(_, p)| p)
            .collect();
    let provider = crypto();
    let verifier = client_verifier(&t, dir, provider.clone())?;
    let builder = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .context("min_version, max_version")?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("cert_file, key_file: the key does not serve the certificate")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Who may connect: `None` for anyone; with a client CA, only clients it signed (when given a
/// certificate, or always).
fn client_verifier(
    t: &TlsFile,
    dir: &Path,
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> anyhow::Result<Option<Arc<dyn ClientCertVerifier>>> {
    // exporter-toolkit's default with a CA is to require and verify.
    let default = if t.client_ca_file.is_some() {
        "RequireAndVerifyClientCert"
    } else {
        "NoClientCert"
    };
    let kind = t.client_auth_type.as_deref().unwrap_or(default);
    let optional = match kind {
        "NoClientCert" => {
            if t.client_ca_file.is_some() {
                bail!(
                    "client_ca_file is set but client_auth_type is NoClientCert: the CA would check nothing"
                );
            }
            return Ok(None);
        }
        "VerifyClientCertIfGiven" => true,
        "RequireAndVerifyClientCert" => false,
        "RequestClientCert" | "RequireAnyClientCert" => bail!(
            "client_auth_type: {kind} accepts certificates no CA signed, which the agent does not do; use VerifyClientCertIfGiven or RequireAndVerifyClientCert with client_ca_file"
        ),
        other => bail!(
            "client_auth_type: {other:?} is not one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"
        ),
    };
    let Some(ca) = &t.client_ca_file else {
        bail!("client_auth_type: {kind} needs client_ca_file, the CA that signs the clients");
    };
    let ca = dir.join(ca);
    let mut roots = RootCertStore::empty();
    let found: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&ca)
        .and_then(Iterator::collect)
        .with_context(|| format!("client_ca_file: cannot read {}", ca.display()))?;
    let (added, _) = roots.add_parsable_certificates(found);
    if added == 0 {
        bail!(
            "client_ca_file: no usable CA certificate in {}",
            ca.display()
        );
    }
    let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
    let builder = if optional {
        builder.allow_unauthenticated()
    } else {
        builder
    };
    Ok(Some(builder.build().context("client_ca_file")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        format!("{:#}", build(text, Path::new("/nonexistent")).unwrap_err())
    }

    #[test]
    fn an_empty_file_serves_plain_http_to_anyone() {
        let c = build("", Path::new("/")).unwrap();
        assert!(c.tls.is_none() && c.users.is_empty() && c.headers.is_empty());
    }

    #[test]
    fn users_and_headers_read_as_exporter_toolkit_writes_them() {
        let c = build(
            "basic_auth_users:\n  prometheus: $2y$10$VXlvWNCwpplqzq7q4X8E4OKc0ltbuOPh5zGrWUdBpAvBzPsOWFjL.\n\
             http_server_config:\n  http2: false\n  headers:\n    x-frame-options: deny\n",
            Path::new("/"),
        )
        .unwrap();
        assert_eq!(c.users.keys().collect::<Vec<_>>(), ["prometheus"]);
        assert_eq!(
            c.headers,
            [("X-Frame-Options".to_owned(), "deny".to_owned())]
        );
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_key() {
        for (text, names) in [
            ("tls_server_config:\n  cert_fle: a.crt\n", "cert_fle"),
            (
                "basic_auth_users:\n  ops: hunter2\n",
                "basic_auth_users.ops",
            ),
            (
                "http_server_config:\n  headers:\n    Server: x\n",
                "headers.Server",
            ),
            (
                "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
                "X-Content-Type-Options",
            ),
            ("tls_server_config:\n  key_file: k\n", "cert_file"),
            (
                "tls_server_config:\n  cert_file: a.crt\n  key_file: a.key\n",
                "/nonexistent/a.crt",
            ),
            (
                "tls_server_config:\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
                "cipher_suites",
            ),
            ("listen: x\n", "listen"),
            ("basic_auth_users: [a]\n", "basic_auth_users"),
        ] {
            let why = refused(text);
            assert!(why.contains(names), "{text:?}: {why}");
        }
    }

    #[test]
    fn versions_read_as_go_names_them() {
        assert_eq!(version("min_version", None, "TLS12").unwrap(), 12);
        assert_eq!(version("min_version", Some("TLS10"), "TLS12").unwrap(), 12);
        assert_eq!(version("max_version", Some("TLS13"), "TLS13").unwrap(), 13);
        assert!(
            version("min_version", Some("SSL3"), "TLS12")
                .unwrap_err()
                .to_string()
                .contains("min_version")
        );
    }

    #[test]
    fn a_client_ca_without_a_policy_that_checks_is_refused() {
        let t = TlsFile {
            client_ca_file: Some("ca.crt".into()),
            client_auth_type: Some("NoClientCert".into()),
            ..TlsFile::default()
        };
        let provider = crypto();
        let why = client_verifier(&t, Path::new("/"), provider.clone())
            .err()
            .unwrap()
            .to_string();
        assert!(why.contains("client_ca_file"), "{why}");
        let t = TlsFile {
            client_auth_type: Some("RequireAndVerifyClientCert".into()),
            ..TlsFile::default()
        };
        let why = client_verifier(&t, Path::new("/"), provider)
            .err()
            .unwrap()
            .to_string();
        assert!(why.contains("needs client_ca_file"), "{why}");
    }
}
