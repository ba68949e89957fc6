//! Where alarms go and how: the webhook client (TLS always verified, against the system's CA bundle plus the
//! CAs an admin adds), the addresses it refuses to reach (loopback, private and link-local networks, unless
//! an admin allows them), checked when a webhook is subscribed and again at every connection.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

/// How long one POST may take.
const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// Where Linux distributions keep the system's CA bundle, in the order looked at (Debian and Ubuntu, where
/// `update-ca-certificates` writes it; Fedora and RHEL; openSUSE; Alpine). `SSL_CERT_FILE` comes first when set.
const SYSTEM_BUNDLES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// Why the CAs webhooks trust could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TrustError {
    #[error("cannot read the CA bundle {path}: {why}")]
    Read { path: PathBuf, why: std::io::Error },
    #[error("the CA bundle {path} is not PEM: {why}")]
    NotPem { path: PathBuf, why: String },
    #[error("the CA bundle {path} holds no certificates (PEM blocks starting -----BEGIN CERTIFICATE-----)")]
    Empty { path: PathBuf },
    #[error("certificate {n} in the CA bundle {path} cannot be used: {why}")]
    BadCertificate { path: PathBuf, n: usize, why: String },
}

pub use trainyard_core::netaddr::{Net, canonical, restricted};

/// This machine's own addresses (a webhook there is the server's own machine, whatever range it is in).
#[allow(clippy::disallowed_methods)] // Webhook delivery is the shell: it reads the machine's addresses.
pub fn machine_addresses() -> Vec<IpAddr> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    trainyard_core::netaddr::own_addresses(&read("/proc/net/fib_trie"), &read("/proc/net/if_inet6"))
}

/// How long a subscription waits for its webhook's name to resolve (a slow resolver must not hold the API;
/// delivery checks again anyway).
const SUBSCRIBE_LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);

/// Which webhook destinations are allowed: every public address, and restricted ones only inside a network
/// an admin allowed (`trainyard up --webhook-allow-net CIDR`, repeatable).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WebhookPolicy {
    pub allowed_nets: Vec<Net>,
    /// This machine's own addresses ([`machine_addresses`]), refused like the restricted ranges.
    pub own: Vec<IpAddr>,
}

impl WebhookPolicy {
    /// Why `ip` may not be sent to, in words for a problem or the delivery log.
    pub fn refusal(&self, ip: IpAddr) -> Option<String> {
        let own = self.own.iter().any(|o| canonical(*o) == canonical(ip));
        let what = restricted(ip).or(own.then_some("this machine's own"))?;
        if self.allowed_nets.iter().any(|n| n.contains(ip)) {
            return None;
        }
        Some(format!(
            "{ip} is a {what} address; alarm webhooks go to public addresses only, unless an admin allows the \
             network (trainyard up --webhook-allow-net CIDR)"
        ))
    }

    /// Checks a webhook URL as a subscription is made: its host's addresses (an address, or what the name
    /// resolves to now). A name that does not resolve now is let through: delivery checks again, against the
    /// addresses it connects to.
    pub async fn check_url(&self, url: &str) -> Result<(), String> {
        let Some((host, port)) = host_and_port(url) else { return Ok(()) };
        let addrs: Vec<IpAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![ip],
            Err(_) => {
                let lookup = tokio::net::lookup_host((host.as_str(), port));
                match tokio::time::timeout(SUBSCRIBE_LOOKUP_TIMEOUT, lookup).await {
                    Ok(Ok(found)) => found.map(|a| a.ip()).collect(),
                    Ok(Err(_)) | Err(_) => return Ok(()),
                }
            }
        };
        addrs.into_iter().find_map(|ip| self.refusal(ip)).map_or(Ok(()), Err)
    }
}

/// The host (brackets of an IPv6 literal removed) and port of an http(s) URL.
fn host_and_port(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let default_port = if scheme.eq_ignore_ascii_case("https") { 443 } else { 80 };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = after.strip_prefix(':').and_then(|p| p.parse().ok()).unwrap_or(default_port);
        return Some((host.to_owned(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_owned(), p.parse().ok()?)),
        None => Some((authority.to_owned(), default_port)),
    }
}

/// Resolves webhook hosts and keeps only the addresses the policy allows, so the connection goes to an address
/// that was checked (a name that resolves to a public address when subscribed and to 127.0.0.1 when
/// delivered, DNS rebinding, is refused at delivery).
#[derive(Debug)]
struct CheckedResolver {
    policy: WebhookPolicy,
}

impl ureq::unversioned::resolver::Resolver for CheckedResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        use ureq::unversioned::resolver::DefaultResolver;
        let found = DefaultResolver::default().resolve(uri, config, timeout)?;
        let mut kept = self.empty();
        let mut why = None;
        for addr in found.iter() {
            match self.policy.refusal(addr.ip()) {
                None => kept.push(*addr),
                Some(w) => why = why.or(Some(w)),
            }
        }
        if kept.is_empty() {
            let why = why.unwrap_or_else(|| "the receiver's name resolves to no address".to_owned());
            return Err(ureq::Error::Io(std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)));
        }
        Ok(kept)
    }
}

/// How webhooks are sent: one HTTP agent, built once, whose TLS trusts the system's CA bundle (the bundled
/// Mozilla roots where the system has none) plus the CAs of an admin-supplied PEM bundle. Server certificates
/// are always verified; there is no way to turn that off. Destinations are checked against a
/// [`WebhookPolicy`] at the address actually connected to; no proxy is used (it would hide the destination).
#[derive(Clone)]
pub struct Webhooks {
    agent: ureq::Agent,
    trust: String,
    roots: RootCerts,
    policy: WebhookPolicy,
}

impl std::fmt::Debug for Webhooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Webhooks").field("trust", &self.trust).finish_non_exhaustive()
    }
}

impl Webhooks {
    /// Trusts the system's CA bundle and, when given, every certificate in `extra_ca` (a PEM file). An
    /// unreadable or empty file, or one with a certificate rustls cannot read, is an error. The bundled Mozilla
    /// roots are used only when there is neither a system bundle nor `extra_ca`.
    #[allow(clippy::disallowed_methods)] // Webhook delivery is the shell: it finds the system's CA bundle.
    pub fn new(extra_ca: Option<&Path>) -> Result<Webhooks, TrustError> {
        let system = std::env::var_os("SSL_CERT_FILE")
            .map(PathBuf::from)
            .into_iter()
            .chain(SYSTEM_BUNDLES.iter().map(PathBuf::from))
            .find(|p| p.is_file());
        let mut roots = Vec::new();
        let mut trust = Vec::new();
        if let Some(path) = &system {
            // A system bundle may hold certificates rustls cannot use (old or odd roots): those are skipped.
            let certs = read_pem_certificates(path)?;
            let usable: Vec<Certificate<'static>> =
                certs.into_iter().filter(|c| check_ca(c).is_ok()).collect();
            trust.push(format!("{} ({} CAs)", path.display(), usable.len()));
            roots.extend(usable);
        }
        if let Some(path) = extra_ca {
            let certs = read_pem_certificates(path)?;
            for (n, c) in certs.iter().enumerate() {
                check_ca(c).map_err(|why| TrustError::BadCertificate {
                    path: path.to_owned(),
                    n: n + 1,
                    why,
                })?;
            }
            trust.push(format!(
                "{} ({} CA{})",
                path.display(),
                certs.len(),
                if certs.len() == 1 { "" } else { "s" }
            ));
            roots.extend(certs);
        }
        let roots = if system.is_none() && extra_ca.is_none() {
            trust.push("the bundled Mozilla roots (no system CA bundle found)".to_owned());
            RootCerts::WebPki
        } else {
            RootCerts::Specific(Arc::new(roots))
        };
        Ok(Webhooks::with_roots(roots, trust.join(" and ")))
    }

    fn with_roots(roots: RootCerts, trust: String) -> Webhooks {
        Webhooks::build(roots, trust, WebhookPolicy::default())
    }

    fn build(roots: RootCerts, trust: String, policy: WebhookPolicy) -> Webhooks {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(POST_TIMEOUT))
            .proxy(None)
            // A redirect would be a request to a destination nobody checked.
            .max_redirects(0)
            .tls_config(TlsConfig::builder().root_certs(roots.clone()).build())
            .build();
        let resolver = CheckedResolver { policy: policy.clone() };
        let agent = ureq::Agent::with_parts(
            config,
            ureq::unversioned::transport::DefaultConnector::default(),
            resolver,
        );
        Webhooks { agent, trust, roots, policy }
    }

    /// The same trust, sending also to these networks though they are loopback, private, link-local, ...
    pub fn allowing(self, nets: Vec<Net>) -> Webhooks {
        Webhooks::build(
            self.roots,
            self.trust,
            WebhookPolicy { allowed_nets: nets, own: machine_addresses() },
        )
    }

    /// Which destinations are allowed.
    pub fn policy(&self) -> &WebhookPolicy {
        &self.policy
    }

    /// What https receivers' certificates are checked against, for the start-up banner.
    pub fn trust(&self) -> &str {
        &self.trust
    }

    pub(crate) fn post(&self, url: &str, body: &str, headers: &[(&str, String)]) -> Result<(), String> {
        let mut req = self.agent.post(url).header("Content-Type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        match req.send(body.as_bytes()) {
            Ok(resp) if resp.status().is_success() => Ok(()),
            Ok(resp) => Err(format!("the receiver answered {}", resp.status())),
            Err(e) => Err(explain(&e)),
        }
    }
}

#[allow(clippy::disallowed_methods)] // Webhook delivery is the shell: it reads CA files.
fn read_pem_certificates(path: &Path) -> Result<Vec<Certificate<'static>>, TrustError> {
    let text = std::fs::read(path).map_err(|why| TrustError::Read { path: path.to_owned(), why })?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&text) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(TrustError::NotPem { path: path.to_owned(), why: e.to_string() }),
        }
    }
    if certs.is_empty() {
        return Err(TrustError::Empty { path: path.to_owned() });
    }
    Ok(certs)
}

/// Whether rustls accepts `cert` as a trust anchor.
fn check_ca(cert: &Certificate<'_>) -> Result<(), String> {
    let der = rustls::pki_types::CertificateDer::from(cert.der());
    rustls::RootCertStore::empty().add(der).map_err(|e| e.to_string())
}

/// A failed POST in words for the delivery log; certificate problems say what was wrong with the certificate.
fn explain(e: &ureq::Error) -> String {
    let tls = match e {
        ureq::Error::Rustls(e) => Some(e),
        ureq::Error::Io(io) => io.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()),
        _ => None,
    };
    match tls {
        Some(rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer)) => {
            "the receiver's TLS certificate was refused: UnknownIssuer (it is not signed by a CA this server \
             trusts; a receiver with a private CA needs that CA given to the server with --webhook-ca)"
                .to_owned()
        }
        Some(rustls::Error::InvalidCertificate(c)) => {
            format!("the receiver's TLS certificate was refused: {c}")
        }
        Some(other) => format!("the TLS handshake with the receiver failed: {other}"),
        None => e.to_string(),
    }
}

impl Webhooks {
    /// The system's trust alone (the bundled Mozilla roots where the system has no CA bundle): what a
    /// server started without `--webhook-ca` sends with.
    pub fn system() -> Webhooks {
        Webhooks::new(None).unwrap_or_else(|e| {
            eprintln!("trainyard: alarm delivery: {e}; https receivers are checked against the bundled Mozilla roots");
            Webhooks::with_roots(RootCerts::WebPki, "the bundled Mozilla roots".to_owned())
        })
    }
}

#[cfg(test)]
#[allow(clippy::disallowed_methods)] // The tests write CA files to read.
mod tests {
    use super::*;

    #[test]
    fn restricted_addresses_and_allowed_networks() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        for (a, what) in [
            ("127.0.0.1", Some("loopback")),
            ("127.8.9.10", Some("loopback")),
            ("::1", Some("loopback")),
            ("::ffff:127.0.0.1", Some("loopback")),
            ("169.254.169.254", Some("link-local")),
            ("fe80::1", Some("link-local")),
            ("10.1.2.3", Some("private")),
            ("172.31.0.1", Some("private")),
            ("192.168.1.1", Some("private")),
            ("100.64.0.1", Some("private")),
            ("fd00::1", Some("private")),
            ("0.0.0.0", Some("unspecified")),
            ("::", Some("unspecified")),
            ("224.0.0.1", Some("multicast")),
            ("ff02::1", Some("multicast")),
            ("8.8.8.8", None),
            ("172.32.0.1", None),
            ("2001:4860:4860::8888", None),
        ] {
            assert_eq!(restricted(ip(a)), what, "{a}");
        }
        let policy = WebhookPolicy {
            allowed_nets: vec![Net::parse("10.1.0.0/16").unwrap(), Net::parse("::1").unwrap()],
            own: vec![ip("203.0.113.7")],
        };
        assert!(policy.refusal(ip("10.1.200.7")).is_none());
        // This machine's public address, and internal ones written as NAT64 or 6to4.
        assert!(policy.refusal(ip("203.0.113.7")).unwrap().contains("this machine's own address"));
        assert!(policy.refusal(ip("::ffff:203.0.113.7")).unwrap().contains("this machine's own"));
        assert!(policy.refusal(ip("64:ff9b::a9fe:a9fe")).unwrap().contains("link-local"));
        assert!(policy.refusal(ip("2002:7f00:1::")).unwrap().contains("loopback"));
        assert!(policy.refusal(ip("10.2.0.1")).unwrap().contains("private address"));
        assert!(policy.refusal(ip("::1")).is_none());
        assert!(policy.refusal(ip("8.8.8.8")).is_none());
        assert!(Net::parse("10.0.0.0/33").is_err() && Net::parse("nope").is_err());
        assert!(Net::parse("0.0.0.0/0").unwrap().contains(ip("127.0.0.1")));
        assert_eq!(host_and_port("http://[::1]:9/x"), Some(("::1".into(), 9)));
        assert_eq!(host_and_port("https://u:p@Example.com/x?y"), Some(("Example.com".into(), 443)));
    }

    fn file(name: &str, contents: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("trainyard-alarms-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn a_bad_extra_ca_bundle_is_an_error_that_names_the_file_and_the_problem() {
        let missing = std::env::temp_dir().join("trainyard-no-such-ca.pem");
        let e = Webhooks::new(Some(&missing)).unwrap_err();
        assert!(matches!(e, TrustError::Read { .. }), "{e:?}");
        assert!(e.to_string().contains("trainyard-no-such-ca.pem"), "{e}");

        let key_only = rcgen::KeyPair::generate().unwrap().serialize_pem();
        for (name, text) in [("empty.pem", ""), ("text.pem", "not a certificate\n"), ("key.pem", &key_only)] {
            let e = Webhooks::new(Some(&file(name, text))).unwrap_err();
            assert!(matches!(e, TrustError::Empty { .. }), "{name}: {e:?}");
            assert!(e.to_string().contains(name) && e.to_string().contains("no certificates"), "{e}");
        }

        let garbage = "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n";
        let e = Webhooks::new(Some(&file("garbage.pem", garbage))).unwrap_err();
        assert!(matches!(e, TrustError::BadCertificate { n: 1, .. }), "{e:?}");
        assert!(e.to_string().contains("certificate 1 in the CA bundle"), "{e}");

        let e =
            Webhooks::new(Some(&file("broken.pem", "-----BEGIN CERTIFICATE-----\naGVsbG8=\n"))).unwrap_err();
        assert!(matches!(e, TrustError::NotPem { .. }), "{e:?}");
    }

    #[test]
    fn a_good_extra_ca_bundle_is_trusted_beside_the_system_store() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = params.self_signed(&key).unwrap().pem();
        let path = file("two.pem", &format!("{ca}{ca}"));
        let w = Webhooks::new(Some(&path)).unwrap();
        assert!(w.trust().ends_with("two.pem (2 CAs)"), "{}", w.trust());
    }
}
