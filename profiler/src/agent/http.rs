//! The agent's HTTP endpoint: `GET /metrics` answers with the exposition, `/flamegraph` with
//! a cause's flame graph, anything else 404.
//! One request per connection, served in turn: a scraper is one client every few seconds, and
//! serving in turn keeps NVML on one thread.
use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// A client that sends no request in this long is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The request's path, once its head has arrived.
async fn request_path(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 16 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let mut first = head.lines().next()?.split_whitespace();
    (first.next()? == "GET").then(|| first.next().unwrap_or("/").to_owned())
}

/// The value of `key` in a query string (no percent-decoding: cause names need none).
fn query_value<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

async fn answer(
    mut stream: TcpStream,
    render: &impl Fn() -> String,
    flamegraph: &impl Fn(&str) -> Result<String, (u16, String)>,
) {
    let Ok(Some(path)) = tokio::time::timeout(REQUEST_TIMEOUT, request_path(&mut stream)).await
    else {
        return;
    };
    let (route, query) = path.split_once('?').unwrap_or((&path, ""));
    let (status, kind, body) = match route {
        "/metrics" => ("200 OK", CONTENT_TYPE, render()),
        "/flamegraph" => match flamegraph(query_value(query, "cause").unwrap_or("")) {
            Ok(svg) => ("200 OK", "image/svg+xml", svg),
            Err((404, why)) => ("404 Not Found", "text/plain; charset=utf-8", why),
            Err((_, why)) => (
                "500 Internal Server Error",
                "text/plain; charset=utf-8",
                why,
            ),
        },
        "/" => (
            "200 OK",
            "text/plain; charset=utf-8",
            "stallscope agent: /metrics, /flamegraph?cause=CAUSE\n".to_owned(),
        ),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found\n".to_owned(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// Serves until SIGINT or SIGTERM.
pub async fn serve(
    addr: SocketAddr,
    flamegraph: impl Fn(&str) -> Result<String, (u16, String)>,
    render: impl Fn() -> String,
) -> anyhow::Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    eprintln!(
        "stallscope agent: serving http://{}/metrics",
        listener.local_addr()?
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    answer(stream, &render, &flamegraph).await;
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
        }
    }
}
