//! Serving the API: the control loop and alarm delivery started beside it, an optional separate metrics
//! address, and hyper's HTTP/1 connection loop with its limits (header-read timeout, idle timeout through
//! [`IdleTimeout`], a connection cap whose overflow gets a 503 problem).

use crate::background::{spawn_alarm_delivery, spawn_control_loop, webhook_key};
use crate::error::ProblemBody;
use crate::router::{metrics_router, router};
use crate::state::AppState;
use axum::Router;
use axum::http::StatusCode;
use std::sync::Arc;
use std::time::Duration;

/// How long a client may take to send a request's headers (the start line included), and to send the next
/// request on a kept-alive connection: slow or silent clients do not hold connections.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection on which nothing was read or written for this long is closed (a request body or a response
/// the client stopped moving). Streams (log follow) send a keep-alive well within it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once; one more is answered 503 (a problem document) and closed.
pub const MAX_CONNECTIONS: usize = 4096;

/// Limits on HTTP connections (`trainyard up --header-read-timeout-s`, `--idle-timeout-s`,
/// `--max-connections`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            idle_timeout: IDLE_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// How `serve_with` serves, beyond the API itself.
#[derive(Debug, Default)]
pub struct ServeOptions {
    pub limits: HttpLimits,
    /// Where `/metrics` is served without a token (`trainyard up --metrics-listen`): an address for the
    /// scraper only, such as a management interface. On the API's own address `/metrics` takes an admin token.
    pub metrics_listener: Option<tokio::net::TcpListener>,
    /// Where the other servers on the store reach this one's API (`trainyard up --advertise-url`); None: the
    /// address it listens on.
    pub advertise_url: Option<String>,
}

/// Serves the API on `listener` with the control loop and alarm delivery running, with the default
/// [`HttpLimits`] and no separate metrics address.
pub async fn serve(listener: tokio::net::TcpListener, state: AppState) -> std::io::Result<()> {
    serve_with(listener, state, ServeOptions::default()).await
}

/// Serves the API on `listener` with the control loop and alarm delivery running. First, once per store,
/// hidden values sealed by an earlier version without a binding are re-sealed bound to their records
/// ([`trainyard_control::secrets::reseal_legacy`]). The process keeps to small pages from here on (see
/// [`keep_to_small_pages`]).
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: AppState,
    options: ServeOptions,
) -> std::io::Result<()> {
    keep_to_small_pages();
    let resealed = state
        .writer
        .reseal_legacy(&state.secrets)
        .await
        .map_err(|e| std::io::Error::other(format!("re-sealing hidden values: {e}")))?;
    if resealed != Default::default() {
        eprintln!(
            "trainyard: re-sealed the hidden values of {} task(s) and {} TaskEnv variable(s), bound to their records",
            resealed.tasks, resealed.task_env
        );
    }
    let limits = options.limits;
    let metrics_server = options
        .metrics_listener
        .map(|l| tokio::spawn(serve_connections(l, metrics_router(state.clone()), limits)));
    let me = trainyard_store::ServerRecord {
        id: state.election.id().to_owned(),
        address: match options.advertise_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("http://{}", reachable(listener.local_addr()?)),
        },
        host: crate::leader::host_name(),
        backend: state.backend.name().to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        started_at_ms: state.now_ms(),
        seen_at_ms: 0,
    };
    let election = state.election.spawn(state.store.clone(), me);
    let ticker = spawn_control_loop(
        state.control.clone(),
        state.metrics.clone(),
        state.wake.clone(),
        state.election.clone(),
    );
    let alarms = spawn_alarm_delivery(
        state.store.clone(),
        state.webhooks.clone(),
        webhook_key(&state.secrets),
        state.clock.clone(),
        state.election.clone(),
    );
    let inventory = crate::background::spawn_inventory_sync(state.clone());
    let boards = crate::background::spawn_board_follow(state.clone());
    let catalog_follow = crate::background::spawn_catalog_follow(state.clone());
    let workdirs = crate::background::spawn_workdir_collect(state.clone());
    let result = serve_connections(listener, router(state), limits).await;
    ticker.abort();
    election.abort();
    alarms.abort();
    if let Some(i) = inventory {
        i.abort();
    }
    if let Some(c) = catalog_follow {
        c.abort();
    }
    if let Some(w) = workdirs {
        w.abort();
    }
    if let Some(b) = boards {
        b.abort();
    }
    if let Some(m) = metrics_server {
        m.abort();
    }
    result
}

/// Accepts connections and serves each with hyper (HTTP/1.1): headers within the header-read timeout, no
/// idle connection beyond the idle timeout, and at most `max_connections` at once; the next one is answered
/// with a 503 problem and closed, so a client that holds many connections (or forgets to close them) cannot
/// starve the others or the server's file descriptors.
async fn serve_connections(
    listener: tokio::net::TcpListener,
    app: Router,
    limits: HttpLimits,
) -> std::io::Result<()> {
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, or a connection reset before it was accepted: the listener is
                // fine; wait a little rather than spin.
                eprintln!("trainyard: accepting a connection: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(refuse_connection(stream, limits.max_connections));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout));
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .serve_connection(io, service)
                .with_upgrades();
            let _ = conn.await;
            drop(permit);
        });
    }
}

/// How long the accept loop waits after an error accepting a connection.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);
/// How long a refused connection is given to take its 503.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Answers a connection over the cap: a 503 problem document, `Connection: close`.
async fn refuse_connection(mut stream: tokio::net::TcpStream, max: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = ProblemBody::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "too-many-connections",
        "Too many connections",
        format!(
            "the server already serves its limit of {max} connections; retry in a moment, and reuse connections"
        ),
    );
    let body = serde_json::to_string(&body).expect("a problem document always serialises");
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        // Read what the client sent before closing, so the close is not a reset that loses the answer.
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

/// A connection that fails with `TimedOut` when nothing was read or written on it for `timeout` while
/// hyper waited on it.
struct IdleTimeout<T> {
    inner: T,
    timeout: Duration,
    sleep: std::pin::Pin<Box<tokio::time::Sleep>>,
}

impl<T> IdleTimeout<T> {
    fn new(inner: T, timeout: Duration) -> Self {
        IdleTimeout { inner, timeout, sleep: Box::pin(tokio::time::sleep(timeout)) }
    }

    /// Something moved: the idle clock starts again.
    fn moved(&mut self) {
        self.sleep.as_mut().reset(tokio::time::Instant::now() + self.timeout);
    }

    /// The inner call is pending: has the connection been idle too long?
    fn idle(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Error> {
        self.sleep
            .as_mut()
            .poll(cx)
            .map(|()| std::io::Error::new(std::io::ErrorKind::TimedOut, "the connection was idle too long"))
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for IdleTimeout<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                self.moved();
                Poll::Ready(r)
            }
            Poll::Pending => self.idle(cx).map(Err),
        }
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for IdleTimeout<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_write(cx, buf) {
            Poll::Ready(r) => {
                self.moved();
                Poll::Ready(r)
            }
            Poll::Pending => self.idle(cx).map(Err),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Turns transparent huge pages off for the server's process. Its allocator (mimalloc) advises its heap for
/// them, so memory it touches afresh (a tick's buffers, a batch of rows, memory it gave back a second earlier
/// and takes again) is faulted in 2 MiB at a time, each zeroed whole: under a stream of creates, 6% of the
/// server's CPU (`perf`, api-bench). Children inherit the setting: pooled supervisors keep to small pages
/// anyway, and their sandboxes get huge pages back.
fn keep_to_small_pages() {
    if let Err(e) = rustix::thread::disable_transparent_huge_pages(true) {
        eprintln!("trainyard: cannot turn transparent huge pages off for the server: {e}");
    }
}

/// The address other servers on this machine reach a listener at: a wildcard one is reached on loopback.
fn reachable(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            (std::net::Ipv4Addr::LOCALHOST, addr.port()).into()
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            (std::net::Ipv6Addr::LOCALHOST, addr.port()).into()
        }
        _ => addr,
    }
}
