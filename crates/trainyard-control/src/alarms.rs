//! Alarm subscriptions: which lifecycle changes raise which alarm event, and the delivery of queued alarms by
//! webhook. A delivery is a JSON POST signed with HMAC-SHA256 (`X-Trainyard-Signature: sha256=<hex>` over the
//! body), retried with exponential backoff, and every try is written to the delivery log in the store.

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;
use std::time::Duration;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_core::spec::{AlarmEvent, TrainingTask};
use trainyard_store::{Store, StoreError, TaskRecord};

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

fn post(url: &str, body: &str, headers: &[(&str, String)]) -> Result<(), String> {
    if url.starts_with("https://") {
        return Err(
            "https webhooks need TLS, which this build does not include yet; use an http:// receiver".into(),
        );
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(POST_TIMEOUT))
        .build()
        .into();
    let mut req = agent.post(url).header("Content-Type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, v);
    }
    match req.send(body.as_bytes()) {
        Ok(resp) if resp.status().is_success() => Ok(()),
        Ok(resp) => Err(format!("the receiver answered {}", resp.status())),
        Err(e) => Err(e.to_string()),
    }
}

/// Delivers what is due. Returns how many deliveries were tried.
pub async fn deliver_due(store: &Store, key: &[u8], now_ms: i64) -> Result<usize, StoreError> {
    let due = store.due_alarms(now_ms, ROUND).await?;
    for d in &due {
        let headers = vec![
            ("X-Trainyard-Signature", signature(key, d.payload.as_bytes())),
            ("X-Trainyard-Event", d.event.clone()),
            ("X-Trainyard-Delivery", d.id.to_string()),
        ];
        let (url, body) = (d.url.clone(), d.payload.clone());
        let outcome = tokio::task::spawn_blocking(move || post(&url, &body, &headers))
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
