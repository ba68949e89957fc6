//! Alarm subscriptions: which lifecycle changes raise which alarm event, and the delivery of queued alarms by
//! webhook. A delivery is a JSON POST signed with HMAC-SHA256 (`X-Trainyard-Signature: sha256=<hex>` over the
//! body), retried with exponential backoff, and every try is written to the delivery log in the store.
//!
//! The webhook client and the addresses it may reach are `webhooks.rs` (re-exported here): `https://`
//! receivers are reached over TLS (rustls, ring) and their certificates are always verified, against the
//! system's CA bundle plus the CAs an admin adds (`Webhooks::new`, `trainyard up --webhook-ca`).

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use std::sync::OnceLock;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_core::spec::{AlarmEvent, TrainingTask};
use trainyard_store::{Store, StoreError, TaskRecord};

pub use crate::webhooks::{Net, TrustError, WebhookPolicy, Webhooks, restricted};

/// Tries before a delivery is given up.
pub const MAX_TRIES: i64 = 8;
/// The first retry waits this long; each next one twice as long.
pub const FIRST_BACKOFF_MS: i64 = 1_000;
/// Deliveries attempted per round.
const ROUND: u32 = 64;

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
    format!("sha256={}", crate::secrets::hex(&bytes))
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
