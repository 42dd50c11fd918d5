//! The agent's HTTP endpoint: `GET /metrics` answers with the exposition, `/flamegraph` with
//! a cause's flame graph, anything else 404; over TLS and behind basic auth when the web
//! config asks for them.
//!
//! hyper serves each connection as its own task, so a slow or idle client delays nobody
//! else. What one client can hold is bounded: the time to send a request's head (and to
//! finish a TLS handshake), the head's size, a connection's lifetime, and the number of
//! connections open. Every task runs on the agent's one serving thread, so NVML is still read
//! from one thread, one scrape at a time.
use std::{convert::Infallible, net::SocketAddr, rc::Rc, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::{Bytes, Incoming},
    header::{self, HeaderName, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
};
use tokio_rustls::TlsAcceptor;

use super::{basic_auth::BasicAuth, web_config::WebConfig};

const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";
/// A client that has not sent a whole request head (or finished its TLS handshake) in this
/// long is dropped. Prometheus sends its head at once.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// A request head larger than this is answered 431.
const MAX_HEAD: usize = 16 * 1024;
/// Connections open at once; those over it are closed as they come. An idle one lasts
/// `HEAD_TIMEOUT`, so a flood of them ends within that.
const MAX_CONNECTIONS: usize = 1024;
/// A kept-alive connection is asked to close after this long (Prometheus then opens
/// another), and dropped if it has not within `DRAIN`: a client that stops reading its
/// answer holds a connection no longer than that.
const LIFETIME: Duration = Duration::from_secs(120);
const DRAIN: Duration = Duration::from_secs(10);

/// What a request is answered with.
struct Routes<R, F> {
    render: R,
    flamegraph: F,
    auth: BasicAuth,
    headers: Vec<(HeaderName, HeaderValue)>,
}

fn answer(status: StatusCode, kind: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

impl<R, F> Routes<R, F>
where
    R: Fn() -> String,
    F: Fn(&str) -> Result<String, (u16, String)>,
{
    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let mut r = self.route(req).await;
        for (name, value) in &self.headers {
            r.headers_mut().insert(name.clone(), value.clone());
        }
        r
    }

    async fn route(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let authorization = req.headers().get(header::AUTHORIZATION);
        if !self
            .auth
            .allows(authorization.map(HeaderValue::as_bytes))
            .await
        {
            let mut r = answer(StatusCode::UNAUTHORIZED, TEXT, "Unauthorized\n".into());
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"stallscope\""),
            );
            return r;
        }
        if req.method() != Method::GET && req.method() != Method::HEAD {
            let mut r = answer(
                StatusCode::METHOD_NOT_ALLOWED,
                TEXT,
                "only GET and HEAD\n".into(),
            );
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
            return r;
        }
        match req.uri().path() {
            "/metrics" => answer(StatusCode::OK, CONTENT_TYPE, (self.render)()),
            "/flamegraph" => {
                let cause = req.uri().query().and_then(|q| query_value(q, "cause"));
                match (self.flamegraph)(cause.unwrap_or("")) {
                    Ok(svg) => answer(StatusCode::OK, "image/svg+xml", svg),
                    Err((404, why)) => answer(StatusCode::NOT_FOUND, TEXT, why),
                    Err((_, why)) => answer(StatusCode::INTERNAL_SERVER_ERROR, TEXT, why),
                }
            }
            "/" => answer(
                StatusCode::OK,
                TEXT,
                "stallscope agent: /metrics, /flamegraph?cause=CAUSE\n".into(),
            ),
            _ => answer(StatusCode::NOT_FOUND, TEXT, "not found\n".into()),
        }
    }
}

/// The value of `key` in a query string (no percent-decoding: cause names need none).
fn query_value<'q>(query: &'q str, key: &str) -> Option<&'q str> {
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// Serves until SIGINT or SIGTERM.
pub async fn serve<R, F>(
    addr: SocketAddr,
    web: WebConfig,
    flamegraph: F,
    render: R,
) -> anyhow::Result<()>
where
    R: Fn() -> String + 'static,
    F: Fn(&str) -> Result<String, (u16, String)> + 'static,
{
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
    let scheme = if web.tls.is_some() { "https" } else { "http" };
    eprintln!(
        "stallscope agent: serving {scheme}://{}/metrics{}",
        listener.local_addr()?,
        if web.users.is_empty() {
            ""
        } else {
            " (basic auth)"
        }
    );
    let headers = web
        .headers
        .iter()
        .map(|(n, v)| Ok((HeaderName::try_from(n)?, HeaderValue::try_from(v)?)))
        .collect::<anyhow::Result<_>>()?;
    let routes = Rc::new(Routes {
        render,
        flamegraph,
        auth: BasicAuth::new(web.users),
        headers,
    });
    let tls = web.tls.map(TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async move {
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, _)) => {
                            // Over the limit the connection is closed here, as it comes.
                            if let Ok(slot) = slots.clone().try_acquire_owned() {
                                tokio::task::spawn_local(
                                    connection(stream, tls.clone(), routes.clone(), slot),
                                );
                            }
                        }
                        // Out of file descriptors, most likely: give connections time to end.
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    },
                    _ = tokio::signal::ctrl_c() => return Ok(()),
                    _ = term.recv() => return Ok(()),
                }
            }
        })
        .await
}

async fn connection<R, F>(
    stream: TcpStream,
    tls: Option<TlsAcceptor>,
    routes: Rc<Routes<R, F>>,
    _slot: OwnedSemaphorePermit,
) where
    R: Fn() -> String + 'static,
    F: Fn(&str) -> Result<String, (u16, String)> + 'static,
{
    let _ = stream.set_nodelay(true);
    match tls {
        None => http(TokioIo::new(stream), routes).await,
        Some(tls) => {
            // A client that speaks plain HTTP to this port fails its handshake: no answer.
            if let Ok(Ok(stream)) = tokio::time::timeout(HEAD_TIMEOUT, tls.accept(stream)).await {
                http(TokioIo::new(stream), routes).await;
            }
        }
    }
}

async fn http<I, R, F>(io: I, routes: Rc<Routes<R, F>>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    R: Fn() -> String + 'static,
    F: Fn(&str) -> Result<String, (u16, String)> + 'static,
{
    let service = service_fn(move |req| {
        let routes = routes.clone();
        async move { Ok::<_, Infallible>(routes.answer(req).await) }
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
        .max_header_size(MAX_HEAD);
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        () = tokio::time::sleep(LIFETIME) => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(DRAIN, conn).await;
        }
    }
}
