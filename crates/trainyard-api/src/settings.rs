//! Admins' settings of the API itself (`GET`/`PUT /api/v1/admin/settings`), kept in the store as one JSON
//! document, and the per-user cap on queued tasks they hold: every create, clone and resubmit is checked
//! against it ([`check_queued_cap`]) and answered 429 over it.

use crate::error::{ApiError, ApiResult};
use crate::schema::view;
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use trainyard_store::{Store, StoreError};

/// The store's name for the settings document.
pub const SETTINGS_SETTING: &str = "api-settings";

/// How many queued tasks one user may have, unless an admin says otherwise.
pub const DEFAULT_MAX_QUEUED_TASKS_PER_USER: u32 = 1_000;
/// The largest cap an admin may set.
pub const MAX_QUEUED_TASKS_CAP: u32 = 10_000_000;
/// How long this server trusts the settings it read (another server's change counts within this time; this
/// server's own at once).
pub const SETTINGS_CACHE_TTL: Duration = Duration::from_secs(5);
/// Below the cap by at least this much, creates are counted without waiting for each other; nearer, one
/// user's creates, clones and resubmits take turns, so concurrent requests cannot go past the cap together.
const CAP_MARGIN: i64 = 256;
/// How long a count of a user's queued tasks far below the cap stands, at least, for the creates that follow
/// it here (each taking one place of the room it left), so a busy user's creates do not each count again.
/// Other servers' creates meanwhile are not in it: they would have to make [`CAP_MARGIN`] within this time to
/// take the user past the cap, and only until the next count.
///
/// A larger room stands longer, on the same bound: it is taken to shrink by [`CAP_MARGIN`] places every
/// `ROOM_TTL` for what other servers may have created, and is counted again once what is left of it so is
/// within the margin (see [`Room::fresh`]), or after [`ROOM_TRUST_MAX`]. A user far below a high cap (tens of
/// thousands queued under a cap of millions) is then counted once a minute, not every second: each count
/// reads every queued task of theirs.
const ROOM_TTL: Duration = Duration::from_secs(1);
/// The longest a count stands, however large the room it left.
const ROOM_TRUST_MAX: Duration = Duration::from_secs(60);
/// Users whose room is remembered at most (the map is cleared of old entries when it is full).
const ROOM_USERS_MAX: usize = 4096;

view! {
    /// The API's settings: the most queued tasks one user (admins included) may have; a create, clone or
    /// resubmit past it is a 429 (`too-many-queued`).
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct AdminSettings as "AdminSettings" {
        /// The most queued tasks one user may have (admins too): a create, clone or resubmit past it is a 429.
        #[serde(deserialize_with = "whole_number")]
        "maxQueuedTasksPerUser" pub max_queued_tasks_per_user: u32 => QueuedCap,
        /// The most bytes one working directory's files may add up to (`trainyard submit --workdir`).
        #[serde(default = "default_workdir_max_bytes")]
        "workdirMaxBytes" pub workdir_max_bytes: u64 => WorkdirBytes,
        /// The most bytes of working directories one project group may hold.
        #[serde(default = "default_workdir_group_bytes")]
        "workdirGroupBytes" pub workdir_group_bytes: u64 => WorkdirBytes,
        /// Days a working directory no live task names is kept after its last use.
        #[serde(default = "default_workdir_keep_days")]
        "workdirKeepDays" pub workdir_keep_days: u32 => KeepDays,
    }
}

/// One working directory's bytes at most, unless an admin says otherwise.
pub const DEFAULT_WORKDIR_MAX_BYTES: u64 = 1 << 30;
/// A group's working directories' bytes at most, unless an admin says otherwise.
pub const DEFAULT_WORKDIR_GROUP_BYTES: u64 = 20 << 30;
/// Days an unused working directory is kept, unless an admin says otherwise.
pub const DEFAULT_WORKDIR_KEEP_DAYS: u32 = 7;

fn default_workdir_max_bytes() -> u64 {
    DEFAULT_WORKDIR_MAX_BYTES
}
fn default_workdir_group_bytes() -> u64 {
    DEFAULT_WORKDIR_GROUP_BYTES
}
fn default_workdir_keep_days() -> u32 {
    DEFAULT_WORKDIR_KEEP_DAYS
}

/// The schema of a working directory limit in bytes.
#[derive(Debug)]
pub struct WorkdirBytes;

impl crate::schema::ApiSchema for WorkdirBytes {
    const REQUIRED: bool = false;
    fn schema(_: &mut crate::schema::Schemas) -> serde_json::Value {
        serde_json::json!({"type": "integer", "minimum": 1, "maximum": u64::MAX})
    }
}

/// The schema of the days an unused working directory is kept.
#[derive(Debug)]
pub struct KeepDays;

impl crate::schema::ApiSchema for KeepDays {
    const REQUIRED: bool = false;
    fn schema(_: &mut crate::schema::Schemas) -> serde_json::Value {
        serde_json::json!({"type": "integer", "minimum": 1, "maximum": 3650,
                           "description": format!("default {DEFAULT_WORKDIR_KEEP_DAYS}")})
    }
}

/// A `u32` from any JSON number without a fraction: to JSON Schema, whose `integer` the document uses, `5.0`
/// is the integer 5 (a client's JSON library may well write it so), and serde alone refuses it.
fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    let whole = match (n.as_u64(), n.as_f64()) {
        (Some(u), _) => u32::try_from(u).ok(),
        (None, Some(f)) if f.fract() == 0.0 && (0.0..=f64::from(u32::MAX)).contains(&f) => Some(f as u32),
        _ => None,
    };
    whole.ok_or_else(|| serde::de::Error::custom(format!("{n} is not a whole number from 0 to {}", u32::MAX)))
}

/// The schema of the cap (its bounds).
#[derive(Debug)]
pub struct QueuedCap;

impl crate::schema::ApiSchema for QueuedCap {
    fn schema(_: &mut crate::schema::Schemas) -> serde_json::Value {
        serde_json::json!({"type": "integer", "minimum": 1, "maximum": MAX_QUEUED_TASKS_CAP,
                           "description": format!("default {DEFAULT_MAX_QUEUED_TASKS_PER_USER}")})
    }
}

impl Default for AdminSettings {
    fn default() -> Self {
        AdminSettings {
            max_queued_tasks_per_user: DEFAULT_MAX_QUEUED_TASKS_PER_USER,
            workdir_max_bytes: DEFAULT_WORKDIR_MAX_BYTES,
            workdir_group_bytes: DEFAULT_WORKDIR_GROUP_BYTES,
            workdir_keep_days: DEFAULT_WORKDIR_KEEP_DAYS,
        }
    }
}

impl AdminSettings {
    /// What is wrong with these settings, if anything.
    pub fn problems(&self) -> Option<String> {
        let cap = self.max_queued_tasks_per_user;
        let mut problems = Vec::new();
        if !(1..=MAX_QUEUED_TASKS_CAP).contains(&cap) {
            problems.push(format!("maxQueuedTasksPerUser must be 1 to {MAX_QUEUED_TASKS_CAP} (got {cap})"));
        }
        if self.workdir_max_bytes == 0 {
            problems.push("workdirMaxBytes must be at least 1".to_owned());
        }
        if self.workdir_group_bytes == 0 {
            problems.push("workdirGroupBytes must be at least 1".to_owned());
        }
        if !(1..=3650).contains(&self.workdir_keep_days) {
            problems.push(format!("workdirKeepDays must be 1 to 3650 (got {})", self.workdir_keep_days));
        }
        (!problems.is_empty()).then(|| problems.join("; "))
    }

    /// The stored settings (the defaults when none were stored).
    pub async fn load(store: &Store) -> Result<AdminSettings, StoreError> {
        match store.get_setting(SETTINGS_SETTING).await? {
            None => Ok(AdminSettings::default()),
            Some(text) => serde_json::from_str(&text)
                .map_err(|e| StoreError::Corrupt(format!("setting {SETTINGS_SETTING}: {e}"))),
        }
    }

    /// Stores these settings (servers sharing the store read them within [`SETTINGS_CACHE_TTL`]).
    #[allow(clippy::disallowed_methods)] // For the benchmarks' setup, which has no server yet.
    pub async fn save(&self, store: &Store, at_ms: i64) -> Result<(), StoreError> {
        store.put_setting(SETTINGS_SETTING, &self.text(), at_ms).await
    }

    /// These settings as the store keeps them (the API writes them through `trainyard_control::Writer`).
    pub fn text(&self) -> String {
        serde_json::to_string(self).expect("the settings always serialise")
    }
}

/// The settings as last read, each user's turn for creates near the cap, and the room far below it that a
/// recent count left.
#[derive(Debug, Clone, Default)]
pub struct SettingsCache {
    read: Arc<Mutex<Option<(AdminSettings, Instant)>>>,
    turns: Arc<Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
    room: Arc<Mutex<HashMap<String, Room>>>,
}

/// Places left under a cap as a count found them (less those taken since).
#[derive(Debug)]
struct Room {
    cap: i64,
    left: i64,
    at: Instant,
    /// When a request began counting again, this room having grown old: until that count is in (within
    /// [`ROOM_TTL`]), the user's other creates go on taking places here rather than each counting too.
    recount: Option<Instant>,
}

impl Room {
    /// Whether this count still stands: what is left of the room, less [`CAP_MARGIN`] places for every
    /// [`ROOM_TTL`] since the count (what other servers may have created meanwhile), is more than the margin;
    /// for at least `ROOM_TTL` and at most [`ROOM_TRUST_MAX`].
    fn fresh(&self) -> bool {
        let age = self.at.elapsed();
        if age < ROOM_TTL {
            return true;
        }
        if age >= ROOM_TRUST_MAX {
            return false;
        }
        let others = (CAP_MARGIN as f64 * age.as_secs_f64() / ROOM_TTL.as_secs_f64()).ceil() as i64;
        self.left - others > CAP_MARGIN
    }
}

impl SettingsCache {
    /// The settings in force: read from the store at most every [`SETTINGS_CACHE_TTL`].
    pub async fn get(&self, store: &Store) -> ApiResult<AdminSettings> {
        if let Some((s, at)) = &*self.read.lock().unwrap_or_else(|e| e.into_inner())
            && at.elapsed() < SETTINGS_CACHE_TTL
        {
            return Ok(s.clone());
        }
        let s = AdminSettings::load(store).await?;
        self.set(s.clone());
        Ok(s)
    }

    /// Settings this server just stored count at once.
    pub fn set(&self, s: AdminSettings) {
        *self.read.lock().unwrap_or_else(|e| e.into_inner()) = Some((s, Instant::now()));
        self.room.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Takes one place of the room a recent count left the user far below `cap`, if there is one.
    ///
    /// One request counts again when the room grows old; the user's others meanwhile keep taking places
    /// from it (a busy user's concurrent creates all counting at once cost more than the creates).
    fn take_room(&self, user: &str, cap: i64) -> bool {
        let mut room = self.room.lock().unwrap_or_else(|e| e.into_inner());
        let Some(r) = room.get_mut(user) else { return false };
        if r.cap != cap || r.left <= CAP_MARGIN {
            return false;
        }
        let fresh = r.fresh() || r.recount.is_some_and(|t| t.elapsed() < ROOM_TTL);
        if fresh {
            r.left -= 1;
        } else {
            r.recount = Some(Instant::now());
        }
        fresh
    }

    fn set_room(&self, user: &str, cap: i64, left: i64) {
        let mut room = self.room.lock().unwrap_or_else(|e| e.into_inner());
        if room.len() >= ROOM_USERS_MAX {
            room.retain(|_, r| r.at.elapsed() < ROOM_TTL);
        }
        room.insert(user.to_owned(), Room { cap, left, at: Instant::now(), recount: None });
    }

    /// A count found the user near the cap: no room to take places from until the next count.
    fn forget_room(&self, user: &str) {
        self.room.lock().unwrap_or_else(|e| e.into_inner()).remove(user);
    }

    /// The user's turn (one at a time near the cap).
    fn turn(&self, user: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
        // Turns nobody holds or waits for are dropped, so the map holds only users creating right now.
        turns.retain(|_, t| Arc::strong_count(t) > 1);
        turns.entry(user.to_owned()).or_default().clone()
    }
}

/// What a caller holds while a task it was allowed under the cap is stored: near the cap, the user's turn.
#[derive(Debug)]
pub struct CapPass(#[allow(dead_code)] Option<tokio::sync::OwnedMutexGuard<()>>);

/// Checks that `owner` may have one more queued task: their queued tasks (not deleted) are fewer than the
/// cap, or the request is a retry of a create (its `Idempotency-Key` was used before: it creates nothing).
/// Over the cap it is a 429 that names the cap and the count. Near the cap the owner's requests take turns
/// until the returned pass is dropped (after the task is stored), so concurrent ones cannot pass it together.
pub async fn check_queued_cap(
    settings: &SettingsCache,
    store: &Store,
    owner: &str,
    idempotency_key: Option<&str>,
) -> ApiResult<CapPass> {
    let cap = i64::from(settings.get(store).await?.max_queued_tasks_per_user);
    if settings.take_room(owner, cap) {
        return Ok(CapPass(None));
    }
    let queued = store.queued_count(owner, cap).await?;
    if queued + CAP_MARGIN < cap {
        settings.set_room(owner, cap, cap - queued - 1);
        return Ok(CapPass(None));
    }
    settings.forget_room(owner);
    let turn = settings.turn(owner).lock_owned().await;
    // Counted again in turn: what the requests before this one stored is in the count now.
    let queued = store.queued_count(owner, cap).await?;
    if queued < cap {
        return Ok(CapPass(Some(turn)));
    }
    if let Some(key) = idempotency_key
        && store.idempotency_key_used(owner, key).await?
    {
        return Ok(CapPass(Some(turn)));
    }
    // The whole count for the answer (the decision needed no more than the cap's worth), within a bound.
    let queued = store.queued_count(owner, REPORTED_COUNT_MAX).await?;
    Err(ApiError::TooManyQueued { limit: cap as u64, queued: queued as u64 })
}

/// A refusal counts the user's queued tasks up to this many.
const REPORTED_COUNT_MAX: i64 = 100_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_far_below_the_cap_is_taken_place_by_place_then_counted_again() {
        let cache = SettingsCache::default();
        assert!(!cache.take_room("alice", 1000), "nothing counted yet");
        cache.set_room("alice", 1000, CAP_MARGIN + 3);
        assert!((0..3).all(|_| cache.take_room("alice", 1000)));
        assert!(!cache.take_room("alice", 1000), "within the margin: counted again, in turn");
        cache.set_room("alice", 1000, CAP_MARGIN + 10);
        assert!(!cache.take_room("bob", 1000), "per user");
        assert!(!cache.take_room("alice", 500), "counted under another cap");
        cache.set(AdminSettings { max_queued_tasks_per_user: 1000, ..AdminSettings::default() });
        assert!(!cache.take_room("alice", 1000), "new settings forget every room");
    }

    #[test]
    fn an_old_room_is_counted_again_by_one_request_while_the_others_take_places() {
        let cache = SettingsCache::default();
        let old = Instant::now().checked_sub(ROOM_TTL * 2).unwrap();
        let room = Room { cap: 1000, left: CAP_MARGIN + 100, at: old, recount: None };
        cache.room.lock().unwrap().insert("alice".into(), room);
        assert!(!cache.take_room("alice", 1000), "the first to find it old counts again");
        assert!((0..10).all(|_| cache.take_room("alice", 1000)), "the others take places meanwhile");
        assert_eq!(cache.room.lock().unwrap()["alice"].left, CAP_MARGIN + 90);
        // A count that never came in (its store read failed) is made again by the next request, later.
        cache.room.lock().unwrap().get_mut("alice").unwrap().recount = Some(old);
        assert!(!cache.take_room("alice", 1000));
        assert!(cache.take_room("alice", 1000));
        // The count came in near the cap: nothing is taken from the old room after it.
        cache.forget_room("alice");
        assert!(!cache.take_room("alice", 1000));
    }

    #[test]
    fn a_larger_room_stands_longer_as_if_other_servers_took_the_margin_every_second() {
        let room = |left: i64, age: Duration| Room {
            cap: 10_000_000,
            left,
            at: Instant::now().checked_sub(age).unwrap(),
            recount: None,
        };
        let s = Duration::from_secs;
        // Any room stands for ROOM_TTL.
        assert!(room(CAP_MARGIN + 1, Duration::ZERO).fresh());
        assert!(!room(CAP_MARGIN + 1, s(1)).fresh());
        // 3 margins over the margin: 2 s stand (2 margins taken), 3 s do not.
        assert!(room(4 * CAP_MARGIN, s(2)).fresh());
        assert!(!room(4 * CAP_MARGIN, s(3)).fresh());
        // A room of millions stands up to the longest trust, and not past it.
        assert!(room(9_900_000, ROOM_TRUST_MAX - s(1)).fresh());
        assert!(!room(9_900_000, ROOM_TRUST_MAX).fresh());
        // Through take_room: an old large room is taken from, an old small one is counted again.
        let cache = SettingsCache::default();
        cache.room.lock().unwrap().insert("alice".into(), room(1_000_000, s(10)));
        cache.room.lock().unwrap().insert("bob".into(), room(2 * CAP_MARGIN, s(10)));
        assert!(cache.take_room("alice", 10_000_000));
        assert!(!cache.take_room("bob", 10_000_000));
    }

    #[test]
    fn settings_are_checked() {
        assert_eq!(AdminSettings::default().max_queued_tasks_per_user, 1000);
        assert!(AdminSettings::default().problems().is_none());
        for bad in [0, MAX_QUEUED_TASKS_CAP + 1] {
            assert!(
                AdminSettings { max_queued_tasks_per_user: bad, ..AdminSettings::default() }
                    .problems()
                    .is_some(),
                "{bad}"
            );
        }
    }
}
