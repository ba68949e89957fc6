//! Alarm subscriptions: which lifecycle changes raise which alarm event, and the delivery of queued alarms by
//! webhook. A delivery is a JSON POST signed with HMAC-SHA256 (`X-Trainyard-Signature: sha256=<hex>` over the
//! body), retried with exponential backoff, and every try is written to the delivery log in the store.
//!
//! `https://` receivers are reached over TLS (rustls, ring) and their certificates are always verified, against
//! the system's CA bundle plus the CAs an admin adds (`Webhooks::new`, `trainyard up --webhook-ca`).

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_core::spec::{AlarmEvent, TrainingTask};
use trainyard_store::{Store, StoreError, TaskRecord};
use ureq::tls::{Certificate, PemItem, RootCerts, TlsConfig};

/// Tries before a delivery is given up.
pub const MAX_TRIES: i64 = 8;
/// The first retry waits this long; each next one twice as long.
pub const FIRST_BACKOFF_MS: i64 = 1_000;
/// Deliveries attempted per round.
const ROUND: u32 = 64;
/// How long one POST may take.
const POST_TIMEOUT: Duration = Duration::from_secs(5);

/// The alarm events a transition raises by itself (failures are decided after the retry decision).
pub fn events_for(to: Status, reason: Reason) -> &'static [AlarmEvent] {
    match (to, reason) {
        (Status::Succeeded, _) => &[AlarmEvent::Succeeded],
        (Status::Stopped, _) => &[AlarmEvent::Stopped],
        (Status::Stopping, Reason::Preempted) => &[AlarmEvent::Preempted],
        (Status::Queued, Reason::Resubmitted) => &[AlarmEvent::Resubmitted],
        _ => &[],
    }
}

/// The store's name for a user's own alarm subscriptions (a JSON list).
pub fn user_setting(user: &str) -> String {
    format!("alarms:{user}")
}

/// A user's own subscriptions (they apply to every task the user owns).
pub async fn user_subscriptions(
    store: &Store,
    user: &str,
) -> Result<Vec<trainyard_core::spec::AlarmSubscription>, StoreError> {
    use trainyard_core::decode::{Decode, Decoder};
    let Some(text) = store.get_setting(&user_setting(user)).await? else { return Ok(Vec::new()) };
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| StoreError::Corrupt(e.to_string()))?;
    let mut d = Decoder::default();
    Ok(Vec::<trainyard_core::spec::AlarmSubscription>::decode(&value, "alarms", &mut d).unwrap_or_default())
}

/// Queues `event` for every subscription of the task that asks for it.
pub async fn raise(
    store: &Store,
    task: &TrainingTask,
    t: &TaskRecord,
    event: AlarmEvent,
    message: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    let mine = user_subscriptions(store, &t.owner).await?;
    for sub in task.spec.advanced.alarms.iter().chain(&mine).filter(|a| a.events.contains(&event)) {
        enqueue(store, sub, t, event, message, now_ms).await?;
    }
    Ok(())
}

/// Queues `event` for one subscription.
pub async fn enqueue(
    store: &Store,
    sub: &trainyard_core::spec::AlarmSubscription,
    t: &TaskRecord,
    event: AlarmEvent,
    message: &str,
    now_ms: i64,
) -> Result<(), StoreError> {
    {
        let payload = json!({
            "event": event.as_str(),
            "task": {"id": t.id, "name": t.name, "owner": t.owner, "projectGroup": t.project_group,
                     "status": t.status, "attempt": t.attempt},
            "message": message,
            "atMs": now_ms,
        });
        store
            .enqueue_alarm(&t.id, t.attempt, event.as_str(), &sub.webhook, &payload.to_string(), now_ms)
            .await?;
    }
    Ok(())
}

/// The signature of a body under the signing key, as sent in `X-Trainyard-Signature`.
pub fn signature(key: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(body);
    let bytes = mac.finalize().into_bytes();
    format!("sha256={}", bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

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

/// How webhooks are sent: one HTTP agent, built once, whose TLS trusts the system's CA bundle (the bundled
/// Mozilla roots where the system has none) plus the CAs of an admin-supplied PEM bundle. Server certificates
/// are always verified; there is no way to turn that off.
#[derive(Clone)]
pub struct Webhooks {
    agent: ureq::Agent,
    trust: String,
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
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(POST_TIMEOUT))
            .tls_config(TlsConfig::builder().root_certs(roots).build())
            .build()
            .into();
        Webhooks { agent, trust }
    }

    /// What https receivers' certificates are checked against, for the start-up banner.
    pub fn trust(&self) -> &str {
        &self.trust
    }

    fn post(&self, url: &str, body: &str, headers: &[(&str, String)]) -> Result<(), String> {
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

/// Delivers what is due with the system's trust ([`Webhooks::system`]). Returns how many deliveries were
/// tried.
pub async fn deliver_due(store: &Store, key: &[u8], now_ms: i64) -> Result<usize, StoreError> {
    static SYSTEM: OnceLock<Webhooks> = OnceLock::new();
    deliver_due_with(store, SYSTEM.get_or_init(Webhooks::system), key, now_ms).await
}

/// Delivers what is due with `webhooks`. Returns how many deliveries were tried.
pub async fn deliver_due_with(
    store: &Store,
    webhooks: &Webhooks,
    key: &[u8],
    now_ms: i64,
) -> Result<usize, StoreError> {
    let due = store.due_alarms(now_ms, ROUND).await?;
    for d in &due {
        let headers = vec![
            ("X-Trainyard-Signature", signature(key, d.payload.as_bytes())),
            ("X-Trainyard-Event", d.event.clone()),
            ("X-Trainyard-Delivery", d.id.to_string()),
        ];
        let (url, body, webhooks) = (d.url.clone(), d.payload.clone(), webhooks.clone());
        let outcome = tokio::task::spawn_blocking(move || webhooks.post(&url, &body, &headers))
            .await
            .unwrap_or_else(|e| Err(format!("delivery task failed: {e}")));
        let tries = d.tries + 1;
        match outcome {
            Ok(()) => store.record_delivery(d.id, "delivered", tries, now_ms, "", now_ms).await?,
            Err(e) if tries >= MAX_TRIES => {
                store.record_delivery(d.id, "failed", tries, now_ms, &e, now_ms).await?
            }
            Err(e) => {
                let backoff = FIRST_BACKOFF_MS << (tries - 1).min(20);
                store.record_delivery(d.id, "pending", tries, now_ms + backoff, &e, now_ms).await?
            }
        }
    }
    Ok(due.len())
}

#[cfg(test)]
mod tests {
    use super::*;

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
