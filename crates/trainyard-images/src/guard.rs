//! The address guard of a pull on a member's behalf from a registry the catalog does not list.
//!
//! Checking the registry's name once before the pull is not enough: the registry client resolves the name
//! again when it connects (a name that answers a public address to the check and `10.0.0.1` or
//! `169.254.169.254` to the client passes), and the registry itself names more hosts the client then
//! connects to (its token service's realm, a redirect for a blob). So every connection of such a pull goes
//! through this guard, a proxy on the loopback that the pull's client is configured to use for `http` and
//! `https`: it resolves each host once, refuses the connection when any of its addresses is one the policy
//! refuses (the webhooks' rules: private, loopback, link-local and this machine's own addresses), and
//! connects to the very address it checked. `https` goes through as a `CONNECT` tunnel (TLS stays end to
//! end); plain `http` is forwarded one request per connection.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Why a connection to `ip` is refused, if it is.
pub(crate) type Policy = Arc<dyn Fn(IpAddr) -> Option<String> + Send + Sync>;

/// The rules for registries the catalog does not list: no restricted address (the webhooks' rules) and none
/// of this machine's own.
pub(crate) fn public_only() -> Policy {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let own =
        trainyard_core::netaddr::own_addresses(&read("/proc/net/fib_trie"), &read("/proc/net/if_inet6"));
    Arc::new(move |ip| {
        let canonical = trainyard_core::netaddr::canonical;
        match trainyard_core::netaddr::restricted(ip) {
            Some(what) => Some(format!("a {what} address")),
            None if own.iter().any(|o| canonical(*o) == canonical(ip)) => {
                Some("this machine's own address".to_owned())
            }
            None => None,
        }
    })
}

/// How long a host's name may take to resolve, and a connection to be made.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The most a request's head may hold.
const MAX_HEAD: usize = 32 * 1024;

/// A running guard; it stops taking connections when dropped (those it passed on run to their end).
pub(crate) struct Guard {
    /// `http://127.0.0.1:PORT`, for the client's proxy settings.
    pub(crate) url: String,
    refused: Arc<Mutex<Vec<String>>>,
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl Guard {
    /// Starts a guard with `policy` on the current runtime.
    pub(crate) async fn start(policy: Policy) -> std::io::Result<Guard> {
        let listener = TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let url = format!("http://{}", listener.local_addr()?);
        let refused: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = refused.clone();
        let accepting = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (policy, seen) = (policy.clone(), seen.clone());
                tokio::spawn(async move {
                    if let Err(why) = serve(conn, &policy).await
                        && let Ok(mut s) = seen.lock()
                    {
                        s.push(why);
                    }
                });
            }
        });
        Ok(Guard { url, refused, accepting })
    }

    /// The connections it refused, each with why, so far.
    pub(crate) fn refused(&self) -> Vec<String> {
        self.refused.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// Serves one client connection. Err: a connection the policy refused, with why (answered `403`).
async fn serve(mut client: TcpStream, policy: &Policy) -> Result<(), String> {
    let Ok((head, rest)) = read_head(&mut client).await else { return Ok(()) };
    let text = String::from_utf8_lossy(&head);
    let mut lines = text.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut words = first.split(' ');
    let (method, target, version) = (
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
        words.next().unwrap_or_default(),
    );
    if method.eq_ignore_ascii_case("CONNECT") {
        let mut upstream = match dial(target, 443, policy).await {
            Ok(s) => s,
            Err(why) => return answer(&mut client, why).await,
        };
        if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_err()
            || upstream.write_all(&rest).await.is_err()
        {
            return Ok(());
        }
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        return Ok(());
    }
    // A plain-`http` request in absolute form: forwarded in origin form, alone on its connection.
    let Some(after) = target.strip_prefix("http://") else {
        let _ = client
            .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .await;
        return Ok(());
    };
    let (authority, path) = match after.find('/') {
        Some(i) => (&after[..i], &after[i..]),
        None => (after, "/"),
    };
    let mut upstream = match dial(authority, 80, policy).await {
        Ok(s) => s,
        Err(why) => return answer(&mut client, why).await,
    };
    let mut out = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim().to_ascii_lowercase();
        if !matches!(name.as_str(), "connection" | "proxy-connection" | "keep-alive" | "proxy-authorization")
        {
            out.push_str(line);
            out.push_str("\r\n");
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    if upstream.write_all(out.as_bytes()).await.is_err() || upstream.write_all(&rest).await.is_err() {
        return Ok(());
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
    Ok(())
}

/// Why a connection was not made.
enum Denied {
    /// The policy refuses one of the host's addresses.
    Refused(String),
    /// The host does not resolve or answer (the pull fails as unreachable, as without the guard).
    Unreachable(String),
}

/// Answers a connection that was not made (`403` refused, `502` unreachable); Err holds a refusal's why.
async fn answer(client: &mut TcpStream, denied: Denied) -> Result<(), String> {
    let (status, why) = match &denied {
        Denied::Refused(why) => ("403 Forbidden", why),
        Denied::Unreachable(why) => ("502 Bad Gateway", why),
    };
    let body = format!("trainyard: {why}\n");
    let msg = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(msg.as_bytes()).await;
    match denied {
        Denied::Refused(why) => Err(why),
        Denied::Unreachable(_) => Ok(()),
    }
}

/// Reads a request's head (through the blank line); returns it and what came after it.
async fn read_head(c: &mut TcpStream) -> std::io::Result<(Vec<u8>, Vec<u8>)> {
    let mut buf = Vec::with_capacity(2048);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok((buf, rest));
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::other("request head too long"));
        }
        let n = tokio::time::timeout(CONNECT_TIMEOUT, c.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::other("no request"))??;
        if n == 0 {
            return Err(std::io::Error::other("closed before a request"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// `host[:port]` or `[v6][:port]`.
fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    if let Some(v6) = authority.strip_prefix('[') {
        let (h, rest) = v6.split_once(']')?;
        let port = match rest.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if rest.is_empty() => default_port,
            None => return None,
        };
        return Some((h.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None => Some((authority.to_owned(), default_port)),
    }
}

/// Resolves `authority` once, refuses it when any of its addresses is refused, and connects to the checked
/// addresses (in order) only.
async fn dial(authority: &str, default_port: u16, policy: &Policy) -> Result<TcpStream, Denied> {
    let Some((host, port)) = split_authority(authority, default_port).filter(|(h, _)| !h.is_empty()) else {
        return Err(Denied::Unreachable(format!("{authority:?} is not a host to connect to")));
    };
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            match tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host.as_str(), port))).await {
                Ok(Ok(found)) => found.collect(),
                Ok(Err(e)) => return Err(Denied::Unreachable(format!("{host} does not resolve: {e}"))),
                Err(_) => {
                    let why = format!("{host} did not resolve within {} s", LOOKUP_TIMEOUT.as_secs());
                    return Err(Denied::Unreachable(why));
                }
            }
        }
    };
    if let Some((ip, why)) = addrs.iter().find_map(|a| policy(a.ip()).map(|why| (a.ip(), why))) {
        return Err(Denied::Refused(format!("{host} is at {ip}, {why}")));
    }
    let mut last = format!("{host} has no address");
    for a in addrs {
        match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(a)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => last = format!("{a}: {e}"),
            Err(_) => last = format!("{a}: no answer within {} s", CONNECT_TIMEOUT.as_secs()),
        }
    }
    Err(Denied::Unreachable(last))
}
