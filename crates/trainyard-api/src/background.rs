//! What runs beside the API for as long as the server does: the control loop's ticker and alarm delivery.

use crate::backends::AnyBackend;
use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use trainyard_control::Control;
use trainyard_control::secrets::SecretBox;
use trainyard_store::Store;

/// How often the control loop runs without being asked.
pub const TICK_INTERVAL: Duration = Duration::from_millis(100);

/// After a tick, the loop rests at least this many times as long as the tick took.
pub const TICK_REST: u32 = 4;

/// Queued tasks from which the loop rests on a tick's whole length (see [`spawn_control_loop`]).
pub const DEEP_QUEUE: u32 = 1_000;

/// The longest rest after a tick with a shallow queue. Its cycle costs well under a millisecond of CPU; one
/// that took longer by the clock was kept waiting (for a CPU on a busy machine, for the store), and resting
/// four times that would hold up the starts and stops it is settling.
pub const SHALLOW_REST_MAX: Duration = Duration::from_millis(20);

/// Between ticks while an attempt is starting or stopping, or after a wake-up.
pub const SETTLING_INTERVAL: Duration = Duration::from_millis(5);

/// Runs the control loop until the process ends: every [`TICK_INTERVAL`], sooner when woken (a task was
/// created or stopped) or while attempts are starting or stopping ([`SETTLING_INTERVAL`]); never sooner than
/// [`TICK_REST`] times the last tick's length after it ([`DEEP_QUEUE`] tasks or more waiting; else times its
/// scheduling cycle's), so that under a stream of submissions into a deep queue the loop takes at most about a
/// fifth of a core from the API and batches what arrived meanwhile into its next tick.
///
/// With several servers on the store the loop acts only while this server leads (`leader`): each new term
/// starts from the store, as a restarted loop does; a lost term stops it before its next tick.
pub fn spawn_control_loop(
    control: Arc<Mutex<Control<AnyBackend>>>,
    metrics: Arc<Metrics>,
    wake: Arc<tokio::sync::Notify>,
    election: crate::leader::Election,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // The term acted on (`None` before the first look: a server that starts as a follower stands by at
        // once, its backend included).
        let mut term: Option<Option<i64>> = None;
        // When a follower last made its figures from the store.
        let mut views_at =
            std::time::Instant::now().checked_sub(FOLLOWER_VIEWS).unwrap_or_else(std::time::Instant::now);
        loop {
            if election.elected() {
                let now = election.leading();
                if term != Some(now) {
                    let mut c = control.lock().await;
                    match now {
                        Some(_) => {
                            c.lead();
                            c.backend().lead();
                        }
                        None => {
                            c.stand_by();
                            c.backend().stand_by();
                        }
                    }
                    term = Some(now);
                }
                if now.is_none() {
                    if views_at.elapsed() >= FOLLOWER_VIEWS {
                        views_at = std::time::Instant::now();
                        let mut c = control.lock().await;
                        let now_ms = c.sources().clock.now_ms();
                        if let Err(e) = c.refresh_views(now_ms).await {
                            eprintln!("trainyard: reading the store for this follower's figures: {e}");
                        }
                    }
                    election.changed(STAND_BY_LOOK).await;
                    continue;
                }
            }
            let started = std::time::Instant::now();
            let result = {
                let mut control = control.lock().await;
                let now_ms = control.sources().clock.now_ms();
                control.tick(now_ms).await
            };
            let took = started.elapsed();
            let (settling, floor) = match result {
                Ok(report) => {
                    metrics.tick(&report, took);
                    (report.settling > 0, rest_after(&report, took))
                }
                Err(e) => {
                    eprintln!("trainyard: control loop: {e}");
                    (false, TICK_REST * took)
                }
            };
            if settling {
                tokio::time::sleep(SETTLING_INTERVAL.max(floor)).await;
                continue;
            }
            tokio::time::sleep(floor).await;
            let _ = tokio::time::timeout(TICK_INTERVAL.saturating_sub(took + floor), wake.notified()).await;
        }
    })
}

/// The least the loop rests after a tick that took `took` by the clock. With a deep queue the whole tick
/// counts (its sync and cycle dominate, and the rest keeps the loop to about a fifth of a core); with a
/// shallow one only the cycle does, so a new task's start does not wait four times the observations and
/// store writes before it, and at most [`SHALLOW_REST_MAX`].
pub fn rest_after(report: &trainyard_control::TickReport, took: Duration) -> Duration {
    let p = report.phases;
    let cycle =
        Duration::from_micros(u64::from(p.snapshot_us) + u64::from(p.schedule_us) + u64::from(p.commit_us));
    if report.waiting >= DEEP_QUEUE {
        TICK_REST * took
    } else {
        (TICK_REST * cycle.min(took)).min(SHALLOW_REST_MAX)
    }
}

/// How often a follower makes its quota figures from the store.
const FOLLOWER_VIEWS: Duration = Duration::from_secs(1);

/// How often a server that does not lead looks at its role, at the latest.
const STAND_BY_LOOK: Duration = Duration::from_millis(100);

/// How often queued alarm deliveries are looked at.
pub const ALARM_INTERVAL: Duration = Duration::from_millis(500);

/// The key alarm webhooks are signed with: derived from the server key, so it survives restarts with it.
pub fn webhook_key(secrets: &SecretBox) -> Vec<u8> {
    secrets.digest(b"trainyard webhook signing key").into_bytes()
}

/// Delivers queued alarms until the process ends; with several servers on the store, only the leader does.
pub fn spawn_alarm_delivery(
    store: Store,
    webhooks: trainyard_control::alarms::Webhooks,
    key: Vec<u8>,
    clock: Arc<dyn trainyard_control::Clock>,
    election: crate::leader::Election,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            if election.leading().is_some()
                && let Err(e) =
                    trainyard_control::alarms::deliver_due_with(&store, &webhooks, &key, clock.now_ms()).await
            {
                eprintln!("trainyard: alarm delivery: {e}");
            }
            tokio::time::sleep(ALARM_INTERVAL).await;
        }
    })
}

/// How often the cluster's nodes are compared with the catalog at the latest (Kubernetes backend).
pub const INVENTORY_INTERVAL: Duration = Duration::from_secs(2);
/// After a node watch's change, how long the sync waits for more (a burst of node changes is one catalog
/// write).
const INVENTORY_SETTLE: Duration = Duration::from_millis(100);

/// Keeps the catalog's nodes as the clusters have them (Kubernetes backend; nothing for the others): soon
/// after a node watch's change ([`INVENTORY_SETTLE`]), and every [`INVENTORY_INTERVAL`] at the latest, for
/// each cluster whose node watch saw a change, its nodes are merged into the catalog's pools of that cluster
/// ([`trainyard_kube::inventory::merge`]) and the result is stored and used, as an admin's edit is.
pub fn spawn_inventory_sync(state: crate::AppState) -> Option<tokio::task::JoinHandle<()>> {
    let AnyBackend::Kube(fleet) = state.backend.clone() else { return None };
    Some(tokio::spawn(async move {
        let n = fleet.members().len();
        let mut seen_version = vec![None; n];
        let mut before = vec![None; n];
        let changed = Arc::new(tokio::sync::Notify::new());
        for member in fleet.members() {
            let (from, to) = (member.inventory_changed(), changed.clone());
            tokio::spawn(async move {
                loop {
                    from.notified().await;
                    to.notify_one();
                }
            });
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(INVENTORY_INTERVAL) => {}
                _ = changed.notified() => tokio::time::sleep(INVENTORY_SETTLE).await,
            }
            // The catalog is written by the leader alone (each server's watches see the same nodes).
            if state.election.leading().is_none() {
                continue;
            }
            for (i, member) in fleet.members().iter().enumerate() {
                let Some((version, now)) = member.inventory_since(seen_version[i]) else { continue };
                let catalog = state.catalog.get();
                let serves = |pool: &str| {
                    catalog.pools.get(pool).is_some_and(|p| fleet.member_of(&catalog, &p.cluster) == Some(i))
                };
                if let Some((next, said)) =
                    trainyard_kube::inventory::merge(&catalog, before[i].as_ref(), &now, &serves)
                {
                    if let Err(e) = state.writer.replace_catalog(next).await {
                        eprintln!("trainyard: saving the cluster's nodes in the catalog: {e}");
                        continue;
                    }
                    for line in said {
                        println!("trainyard: catalog: {line}");
                    }
                }
                seen_version[i] = Some(version);
                before[i] = Some(now);
            }
        }
    }))
}

/// How often a server that shares its store with others reads the catalog again.
pub const CATALOG_FOLLOW: Duration = Duration::from_secs(1);

/// With several servers on the store, an admin's catalog change through one reaches the others: each reads
/// the stored catalog every [`CATALOG_FOLLOW`] and puts a changed one in force (the leader's loop plans with
/// it from its next tick). Nothing for a server alone on its store.
pub fn spawn_catalog_follow(state: crate::AppState) -> Option<tokio::task::JoinHandle<()>> {
    if !state.election.elected() {
        return None;
    }
    Some(tokio::spawn(async move {
        let mut last: Option<String> = None;
        loop {
            tokio::time::sleep(CATALOG_FOLLOW).await;
            let text = match state.store.get_setting(trainyard_control::CATALOG_SETTING).await {
                Ok(Some(text)) => text,
                Ok(None) => continue,
                Err(e) => {
                    eprintln!("trainyard: reading the catalog from the store: {e}");
                    continue;
                }
            };
            if last.as_deref() == Some(text.as_str()) {
                continue;
            }
            match trainyard_core::Catalog::from_yaml(&text) {
                Ok(catalog) => {
                    if last.is_some() || *state.catalog.get() != catalog {
                        state.catalog.set(catalog);
                    }
                    last = Some(text);
                }
                Err(e) => eprintln!("trainyard: the stored catalog cannot be read: {e}"),
            }
        }
    }))
}

/// How often a follower asks the leader for its boards.
const BOARD_FOLLOW: Duration = Duration::from_secs(1);
/// A leader that has not answered for this long: its boards are taken down rather than shown stale.
const BOARD_STALE: Duration = Duration::from_secs(5);

/// With several servers on the store: while this server follows, the leader's queue positions, wait reasons
/// and starting tasks' waits (which only its control loop knows) are asked for every second and put up on
/// this server's boards, so that a task read through any server says where it stands (at most about a second
/// behind). Asked with the proof of the key the servers share; only what changed is sent again.
pub fn spawn_board_follow(state: crate::AppState) -> Option<tokio::task::JoinHandle<()>> {
    if !state.election.elected() {
        return None;
    }
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .proxy(None)
        .max_redirects(0)
        .build()
        .into();
    let proof = format!("Bearer {}", crate::auth::peer_proof(&state.secrets));
    Some(tokio::spawn(async move {
        // The version of the boards put up, and from which leader; when the leader last answered.
        let mut have: Option<(String, String)> = None;
        let mut answered = std::time::Instant::now();
        loop {
            tokio::time::sleep(BOARD_FOLLOW).await;
            if state.election.leading().is_some() {
                // Its own loop's boards.
                have = None;
                continue;
            }
            let leader = match leader_address(&state).await {
                Some(a) => a,
                None => {
                    if have.is_some() && answered.elapsed() > BOARD_STALE {
                        state.queue.install(Vec::new());
                        state.starts.install(Vec::new());
                        have = None;
                    }
                    continue;
                }
            };
            let since = have.as_ref().filter(|(from, _)| *from == leader).map(|(_, v)| v.clone());
            let (agent, proof, url) = (agent.clone(), proof.clone(), leader.clone());
            let got =
                tokio::task::spawn_blocking(move || fetch_boards(&agent, &proof, &url, since.as_deref()))
                    .await
                    .ok()
                    .flatten();
            match got {
                Some(b) => {
                    answered = std::time::Instant::now();
                    let version = b.version.clone();
                    if !b.unchanged {
                        install_boards(&state, b);
                    }
                    have = Some((leader, version));
                }
                None if answered.elapsed() > BOARD_STALE && have.is_some() => {
                    state.queue.install(Vec::new());
                    state.starts.install(Vec::new());
                    have = None;
                }
                None => {}
            }
        }
    }))
}

/// The leader's API address, if a live leader other than this server is in the registry.
async fn leader_address(state: &crate::AppState) -> Option<String> {
    let lease = state.store.lease().await.ok()?;
    if !lease.held_by(&lease.holder) || lease.holder == state.election.id() {
        return None;
    }
    let servers = state.store.servers(crate::leader::SERVER_GONE_AFTER.as_millis() as i64).await.ok()?;
    servers.into_iter().find(|s| s.id == lease.holder).map(|s| s.address)
}

/// The leader's boards as a follower reads them.
struct Boards {
    version: String,
    unchanged: bool,
    queued: Vec<(std::sync::Arc<str>, trainyard_control::QueueInfo)>,
    starting: Vec<(String, trainyard_control::StartWait)>,
}

/// One ask of the leader's boards (`routes::server::server_boards`'s answer, read back).
fn fetch_boards(agent: &ureq::Agent, proof: &str, leader: &str, since: Option<&str>) -> Option<Boards> {
    use serde_json::Value;
    let mut req = agent.get(format!("{leader}/api/v1/server/boards")).header("Authorization", proof);
    if let Some(v) = since {
        req = req.query("since", v);
    }
    let mut resp = req.call().ok()?;
    if resp.status() != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&resp.body_mut().read_to_string().ok()?).ok()?;
    let mut reasons: std::collections::HashMap<String, std::sync::Arc<str>> =
        std::collections::HashMap::new();
    let mut queued = Vec::new();
    for q in v["queued"].as_array()? {
        let reason = q["reason"].as_str()?;
        let reason = reasons.entry(reason.to_owned()).or_insert_with(|| reason.into()).clone();
        let info = trainyard_control::QueueInfo {
            position: u32::try_from(q["position"].as_u64()?).ok()?,
            position_in_group: u32::try_from(q["positionInGroup"].as_u64()?).ok()?,
            reason,
        };
        queued.push((q["taskId"].as_str()?.into(), info));
    }
    let mut starting = Vec::new();
    for w in v["starting"].as_array()? {
        let wait = trainyard_control::StartWait {
            attempt: w["attempt"].as_i64()?,
            reason: w["reason"].as_str()?.to_owned(),
            since_ms: w["sinceMs"].as_i64()?,
        };
        starting.push((w["taskId"].as_str()?.to_owned(), wait));
    }
    Some(Boards {
        version: v["version"].as_str()?.to_owned(),
        unchanged: v["unchanged"].as_bool()?,
        queued,
        starting,
    })
}

fn install_boards(state: &crate::AppState, b: Boards) {
    state.queue.install(b.queued);
    state.starts.install(b.starting);
}

/// How often unused working directories are collected.
pub const WORKDIR_COLLECT: Duration = Duration::from_secs(3600);

/// Collects working directories every [`WORKDIR_COLLECT`] (the first a minute after the start): those unused
/// for the admin's `workdirKeepDays` that no task still to run or running names, then files nothing names.
/// Only a server with working directories of its own, and with several servers only the leader.
pub fn spawn_workdir_collect(state: crate::AppState) -> Option<tokio::task::JoinHandle<()>> {
    let store = state.workdirs.clone()?;
    Some(tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(60)).await;
        loop {
            if !state.election.elected() || state.election.leading().is_some() {
                collect_workdirs(&state, &store).await;
            }
            tokio::time::sleep(WORKDIR_COLLECT).await;
        }
    }))
}

/// One collection (see [`spawn_workdir_collect`]).
pub async fn collect_workdirs(state: &crate::AppState, store: &trainyard_workdir::store::Store) {
    use trainyard_core::lifecycle::Status;
    let live_statuses: Vec<Status> = Status::ALL.iter().copied().filter(|s| !s.is_terminal()).collect();
    let tasks = match state.store.tasks_in_status(&live_statuses).await {
        Ok(t) => t,
        Err(e) => {
            eprintln!("trainyard: working directories not collected: the tasks cannot be read: {e}");
            return;
        }
    };
    let live: std::collections::BTreeSet<(String, String)> = tasks
        .iter()
        .filter_map(|t| {
            let spec: serde_json::Value = serde_json::from_str(&t.spec_json).ok()?;
            let id = spec["spec"]["environment"]["workdir"].as_str()?;
            Some((t.project_group.clone(), id.to_owned()))
        })
        .collect();
    let keep = match state.settings.get(&state.store).await {
        Ok(s) => Duration::from_secs(u64::from(s.workdir_keep_days) * 86_400),
        Err(_) => return,
    };
    let store = store.clone();
    if let Ok(done) = tokio::task::spawn_blocking(move || store.collect(&live, keep)).await
        && (!done.workdirs.is_empty() || done.files > 0)
    {
        println!(
            "trainyard: collected {} unused working directories and {} files ({} bytes)",
            done.workdirs.len(),
            done.files,
            done.freed_bytes
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trainyard_control::{Phases, TickReport};

    #[test]
    fn the_rest_follows_the_tick_and_a_shallow_queue_never_rests_long() {
        let ms = Duration::from_millis;
        let report = |waiting, cycle_ms: u32| TickReport {
            waiting,
            phases: Phases { schedule_us: cycle_ms * 1000, sync_us: 30_000, ..Phases::default() },
            ..TickReport::default()
        };
        // Deep: the whole tick, four times.
        assert_eq!(rest_after(&report(DEEP_QUEUE, 2), ms(40)), ms(160));
        // Shallow: the cycle alone, four times...
        assert_eq!(rest_after(&report(10, 2), ms(40)), ms(8));
        // ...but a cycle kept waiting (a busy machine) does not hold the next tick back long.
        assert_eq!(rest_after(&report(10, 30), ms(40)), SHALLOW_REST_MAX);
    }
}
