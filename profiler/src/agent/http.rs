//! The agent's HTTP endpoint: `GET /metrics` answers with the exposition, anything else 404.
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

async fn answer(mut stream: TcpStream, render: &impl Fn() -> String) {
    let Ok(Some(path)) = tokio::time::timeout(REQUEST_TIMEOUT, request_path(&mut stream)).await
    else {
        return;
    };
    let (status, kind, body) = match path.split('?').next() {
        Some("/metrics") => ("200 OK", CONTENT_TYPE, render()),
        Some("/") => (
            "200 OK",
            "text/plain; charset=utf-8",
            "stallscope agent: metrics on /metrics\n".to_owned(),
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
pub async fn serve(addr: SocketAddr, render: impl Fn() -> String) -> anyhow::Result<()> {
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
                    answer(stream, &render).await;
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(()),
            _ = term.recv() => return Ok(()),
        }
    }
}
