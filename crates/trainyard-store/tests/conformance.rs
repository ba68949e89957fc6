//! One conformance suite, run against SQLite and against PostgreSQL. Every test gets a fresh database.
//!
//! PostgreSQL comes from `TRAINYARD_TEST_DATABASE_URL`; `scripts/test` starts a throwaway server for it
//! (`scripts/with-postgres`), and `.ci/run` installs Debian's `postgresql`. Without it the PostgreSQL half
//! fails with a message saying so: a silently skipped half would prove nothing.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_store::*;

static NEXT_DB: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    let n = NEXT_DB.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{prefix}{}_{n}_{}", std::process::id(), t % 1_000_000_000)
}

async fn sqlite() -> (Store, String) {
    let dir = std::env::temp_dir().join(unique("trainyard-store-"));
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("trainyard.db").display());
    (Store::connect(&url).await.unwrap(), url)
}

async fn postgres() -> (Store, String) {
    let base = std::env::var("TRAINYARD_TEST_DATABASE_URL").expect(
        "TRAINYARD_TEST_DATABASE_URL must point at a PostgreSQL server: run the tests with scripts/test, \
         which starts one through scripts/with-postgres",
    );
    sqlx::any::install_default_drivers();
    let name = unique("t");
    let admin = sqlx::AnyPool::connect(&base).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
    admin.close().await;
    let (prefix, _) = base.rsplit_once('/').unwrap();
    let url = format!("{prefix}/{name}");
    (Store::connect(&url).await.unwrap(), url)
}

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod on_sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let (store, url) = super::sqlite().await;
                    super::$name(store, url).await;
                }
            )*
        }
        mod on_postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    let (store, url) = super::postgres().await;
                    super::$name(store, url).await;
                }
            )*
        }
    };
}

conformance!(
    create_get_and_idempotency,
    keys_stored_through_another_handle_are_seen,
    concurrent_retries_create_one_task,
    a_burst_of_creates_answers_each_alone,
    list_pages_newest_first_with_filters,
    list_pages_in_every_sort_order,
    visibility_is_decided_in_the_query,
    transitions_check_the_version_and_record_events,
    deleted_tasks_leave_lists_but_keep_history,
    reopening_keeps_everything,
    users_and_tokens,
    settings,
    task_env,
    changes_since,
    tokens_are_revoked_and_users_disabled,
    users_are_held_and_deleted,
    specs_and_hidden_task_env_for_resealing,
    tokens_record_their_last_use,
    queued_tasks_are_counted_per_owner,
    operable_tasks_are_filtered_in_the_query,
    demand_is_kept_and_filters_by_accelerator,
    groups_filter_takes_any_of_several,
    status_times_follow_transitions,
    other_writes_take_turns_with_a_stream_of_creates,
    the_lease_has_one_holder_and_fences_the_writes_of_an_ended_term,
    a_kept_log_is_read_from_any_offset_with_its_cursor,
    kept_metrics_are_read_by_replica_after_a_time,
    a_server_that_does_not_lead_keeps_nothing_of_replicas,
    servers_and_shared_settings,
);

/// A demand of `shapes` (`(replicas, gpus, vcpus, memory MiB)`, in role order).
fn demand(shapes: &[(u32, u64, u64, u64)], options: u32, accelerator: Accelerator) -> TaskDemand {
    let shapes = shapes
        .iter()
        .map(|&(replicas, gpus, vcpus, memory_mib)| ReplicaShape { replicas, gpus, vcpus, memory_mib })
        .collect();
    TaskDemand { shapes, options, accelerator }
}

/// What a task asks for comes back as stored, from a create alone and from a batch of creates (the writer's
/// multi-row INSERT), in lists and reads; the accelerator filter matches GPU and CPU-only tasks and leaves
/// out tasks whose demand is unknown.
async fn demand_is_kept_and_filters_by_accelerator(store: Store, url: String) {
    let gpu = demand(&[(1, 1, 8, 32_768), (3, 1, 8, 32_768)], 2, Accelerator::Gpu);
    let ray = demand(&[(1, 0, 4, 8_192), (2, 2, 16, 65_536)], 1, Accelerator::Gpu);
    let cpu = demand(&[(1, 0, 4, 8_192)], 1, Accelerator::Cpu);
    let mut one = new_task("g1", "alice", "nlp", 10);
    one.demand = Some(gpu.clone());
    store.create_task(&one).await.unwrap();
    // A burst: the writer takes them as one batch.
    let burst = (0..6).map(|i| {
        let mut t = new_task(&format!("b{i}"), "bob", "cv", 20 + i);
        t.demand = match i % 3 {
            0 => Some(ray.clone()),
            1 => Some(cpu.clone()),
            _ => None,
        };
        let store = store.clone();
        async move { store.create_task(&t).await.unwrap() }
    });
    for created in futures_join(burst).await {
        assert!(matches!(created, Created::New(_)));
    }
    let ids = |accelerator: Option<Accelerator>| {
        let store = store.clone();
        async move {
            let f = TaskFilter { accelerator, sort: SortOrder::Oldest, ..Default::default() };
            let page = store.list_tasks(&f, None, 100).await.unwrap();
            page.items.into_iter().map(|t| (t.id, t.demand)).collect::<Vec<_>>()
        }
    };
    let all = ids(None).await;
    assert_eq!(all.len(), 7);
    assert_eq!(all[0], ("g1".to_owned(), Some(gpu.clone())), "a list carries the demand");
    let gpus = ids(Some(Accelerator::Gpu)).await;
    assert_eq!(
        gpus,
        [
            ("g1".to_owned(), Some(gpu.clone())),
            ("b0".into(), Some(ray.clone())),
            ("b3".into(), Some(ray.clone()))
        ]
    );
    let cpus = ids(Some(Accelerator::Cpu)).await;
    assert_eq!(cpus, [("b1".to_owned(), Some(cpu.clone())), ("b4".into(), Some(cpu.clone()))]);
    assert_eq!(store.get_task("b2").await.unwrap().unwrap().demand, None, "unknown stays unknown");
    assert_eq!(store.get_task("b3").await.unwrap().unwrap().demand, Some(ray.clone()));
    // With other filters, and after a reopen.
    let store = Store::connect(&url).await.unwrap();
    let f =
        TaskFilter { accelerator: Some(Accelerator::Gpu), owner: Some("alice".into()), ..Default::default() };
    let page = store.list_tasks(&f, None, 100).await.unwrap();
    assert_eq!(page.items.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["g1"]);
}

/// Waits for every future, concurrently (the store's writer batches what arrives together).
async fn futures_join<F: std::future::Future + Send + 'static>(fs: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = fs.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

/// A list of project groups matches tasks of any of them, alone or with the other filters and visibility.
async fn groups_filter_takes_any_of_several(store: Store, _: String) {
    for (i, group) in ["nlp", "cv", "speech", "nlp", "cv", "speech"].iter().enumerate() {
        let mut t = new_task(&format!("t{i}"), if i < 3 { "alice" } else { "bob" }, group, 10 + i as i64);
        t.public = true;
        store.create_task(&t).await.unwrap();
    }
    let ids = |groups: &[&str], viewer: Option<Viewer>| {
        let store = store.clone();
        let f = TaskFilter {
            project_groups: groups.iter().map(|g| g.to_string()).collect(),
            visible_to: viewer,
            sort: SortOrder::Oldest,
            ..Default::default()
        };
        async move {
            store.list_tasks(&f, None, 100).await.unwrap().items.into_iter().map(|t| t.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(ids(&[], None).await.len(), 6);
    assert_eq!(ids(&["cv"], None).await, ["t1", "t4"]);
    assert_eq!(ids(&["nlp", "speech"], None).await, ["t0", "t2", "t3", "t5"]);
    assert!(ids(&["nope"], None).await.is_empty());
    // Carol sees public tasks of her groups only: asking for more groups shows no more.
    let carol = Viewer { user: "carol".into(), groups: vec!["cv".into()], admin: false };
    assert_eq!(ids(&["nlp", "cv"], Some(carol)).await, ["t1", "t4"]);
}

/// A task's time in its status starts at create and at each change of status (not at a change to the same
/// status); its run starts when an attempt enters Running, ends with it, and is forgotten when it is queued
/// again.
async fn status_times_follow_transitions(store: Store, _: String) {
    let created = store.create_task(&new_task("x", "alice", "nlp", 100)).await.unwrap();
    assert_eq!((created.task().status_since_ms, created.task().run_started_at_ms), (100, None));
    let t = store.get_task("x").await.unwrap().unwrap();
    assert_eq!((t.status_since_ms, t.run_started_at_ms), (100, None));
    let mut version = t.version;
    let mut step = |status: Status, reason: Reason, at_ms: i64| {
        version += 1;
        Transition {
            task_id: "x".into(),
            expected_version: version - 1,
            status,
            attempt: 1,
            at_ms,
            reason,
            message: String::new(),
            placement: None,
            retries: None,
        }
    };
    let times = |t: TaskRecord| (t.status, t.status_since_ms, t.run_started_at_ms);
    let admitted = store.transition(&step(Status::Admitted, Reason::Admitted, 200)).await.unwrap();
    assert_eq!(times(admitted), (Status::Admitted, 200, None));
    let running = store.transition(&step(Status::Running, Reason::Started, 300)).await.unwrap();
    assert_eq!(times(running), (Status::Running, 300, Some(300)));
    // A change that keeps the status (a new placement) keeps both times.
    let again = store.transition(&step(Status::Running, Reason::ScaledUp, 350)).await.unwrap();
    assert_eq!(times(again), (Status::Running, 300, Some(300)));
    let requeued = store.transition(&step(Status::Queued, Reason::Requeued, 400)).await.unwrap();
    assert_eq!(times(requeued), (Status::Queued, 400, None));
    store.transition(&step(Status::Admitted, Reason::Admitted, 500)).await.unwrap();
    store.transition(&step(Status::Running, Reason::Started, 600)).await.unwrap();
    store.transition(&step(Status::Stopping, Reason::StopRequested, 700)).await.unwrap();
    let stopped = store.transition(&step(Status::Stopped, Reason::Terminated, 800)).await.unwrap();
    assert_eq!(times(stopped), (Status::Stopped, 800, Some(600)), "it ran from 600 to 800");
    let listed = store.list_tasks(&TaskFilter::default(), None, 10).await.unwrap().items.remove(0);
    assert_eq!(times(listed), (Status::Stopped, 800, Some(600)), "a list reads the same");
}

/// A token's last use is recorded to the minute: a use within a minute of the recorded one writes nothing;
/// a token never used lists none.
async fn tokens_record_their_last_use(store: Store, _: String) {
    let u = User { name: "alice".into(), role: "member".into(), groups: vec![] };
    store.put_user(&u, 1).await.unwrap();
    let hash = |c: char| c.to_string().repeat(64);
    store.add_token(&hash('a'), "alice", "laptop", 2).await.unwrap();
    store.add_token(&hash('b'), "alice", "ci", 3).await.unwrap();
    let used = |store: Store| async move {
        store.list_tokens("alice").await.unwrap().into_iter().map(|t| t.last_used_at_ms).collect::<Vec<_>>()
    };
    assert_eq!(used(store.clone()).await, [None, None]);
    store.touch_token(&hash('a'), 100_000).await.unwrap();
    assert_eq!(used(store.clone()).await, [Some(100_000), None]);
    store.touch_token(&hash('a'), 100_000 + TOKEN_USE_RESOLUTION_MS - 1).await.unwrap();
    assert_eq!(used(store.clone()).await, [Some(100_000), None], "within the resolution: unchanged");
    store.touch_token(&hash('a'), 100_000 + TOKEN_USE_RESOLUTION_MS).await.unwrap();
    store.touch_token(&hash('b'), 7 * TOKEN_USE_RESOLUTION_MS).await.unwrap();
    assert_eq!(
        used(store.clone()).await,
        [Some(100_000 + TOKEN_USE_RESOLUTION_MS), Some(7 * TOKEN_USE_RESOLUTION_MS)]
    );
    store.touch_token("no-such-hash", 1_000_000).await.unwrap();
}

/// The per-user cap's count: a user's queued tasks that are not deleted, no further than asked; and whether
/// an idempotency key was used (a retry of a create is never refused by the cap).
async fn queued_tasks_are_counted_per_owner(store: Store, _: String) {
    for i in 0..6 {
        let mut t = new_task(&format!("a{i}"), "alice", "nlp", i);
        if i == 5 {
            t.idempotency = Some(("key-a".into(), "h".into()));
        }
        store.create_task(&t).await.unwrap();
    }
    let mut running = new_task("r", "alice", "nlp", 10);
    running.status = Status::Running;
    store.create_task(&running).await.unwrap();
    store.create_task(&new_task("b0", "bob", "nlp", 11)).await.unwrap();
    assert_eq!(store.queued_count("alice", 100).await.unwrap(), 6);
    assert_eq!(store.queued_count("alice", 4).await.unwrap(), 4, "no further than asked");
    assert_eq!(store.queued_count("bob", 100).await.unwrap(), 1);
    assert_eq!(store.queued_count("carol", 100).await.unwrap(), 0);
    store.delete_task("a0", 20).await.unwrap();
    let a1 = store.get_task("a1").await.unwrap().unwrap();
    let admitted = Transition {
        task_id: "a1".into(),
        expected_version: a1.version,
        status: Status::Admitted,
        attempt: 0,
        at_ms: 21,
        reason: Reason::Admitted,
        message: "admitted".into(),
        placement: None,
        retries: None,
    };
    store.transition(&admitted).await.unwrap();
    assert_eq!(store.queued_count("alice", 100).await.unwrap(), 4, "deleted and admitted ones are not");
    assert!(store.idempotency_key_used("alice", "key-a").await.unwrap());
    assert!(!store.idempotency_key_used("bob", "key-a").await.unwrap(), "keys are per user");
    assert!(!store.idempotency_key_used("alice", "key-b").await.unwrap());
}

/// `operable_by`: the user's own tasks and those shared with them with operate rights, not those they
/// may only see.
async fn operable_tasks_are_filtered_in_the_query(store: Store, _: String) {
    for (id, owner) in [("own", "alice"), ("viewed", "bob"), ("operated", "bob"), ("other", "bob")] {
        let mut t = new_task(id, owner, "nlp", 1);
        t.public = true;
        store.create_task(&t).await.unwrap();
    }
    store.share("viewed", "alice", false).await.unwrap();
    store.share("operated", "alice", true).await.unwrap();
    store.share("other", "carol", true).await.unwrap();
    let filter = TaskFilter { operable_by: Some("alice".into()), ..Default::default() };
    let mut ids: Vec<String> =
        store.list_tasks(&filter, None, 100).await.unwrap().items.into_iter().map(|t| t.id).collect();
    ids.sort();
    assert_eq!(ids, ["operated", "own"]);
    let filter =
        TaskFilter { operable_by: Some("alice".into()), owner: Some("bob".into()), ..Default::default() };
    let ids: Vec<String> =
        store.list_tasks(&filter, None, 100).await.unwrap().items.into_iter().map(|t| t.id).collect();
    assert_eq!(ids, ["operated"]);
}

/// Revoking deletes one token of its user only; a disabled user's tokens still say whose they are (so the
/// API can answer "disabled", not "unknown"), and enabling restores them.
async fn tokens_are_revoked_and_users_disabled(store: Store, _: String) {
    use trainyard_store::TOKEN_ID_LEN;
    for name in ["alice", "bob"] {
        let u = User { name: name.into(), role: "member".into(), groups: vec![] };
        store.put_user(&u, 1).await.unwrap();
    }
    let hash = |c: char| c.to_string().repeat(64);
    store.add_token(&hash('a'), "alice", "laptop", 2).await.unwrap();
    store.add_token(&hash('b'), "alice", "ci", 3).await.unwrap();
    store.add_token(&hash('c'), "bob", "", 4).await.unwrap();
    let listed = store.list_tokens("alice").await.unwrap();
    let ids: Vec<&str> = listed.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, [&hash('a')[..TOKEN_ID_LEN], &hash('b')[..TOKEN_ID_LEN]]);
    assert_eq!((listed[1].label.as_str(), listed[1].created_at_ms), ("ci", 3));
    // bob cannot revoke alice's token through his own name; a short or odd id matches nothing.
    assert!(!store.revoke_token("bob", &listed[0].id).await.unwrap());
    assert!(!store.revoke_token("alice", "aaaa").await.unwrap());
    assert!(!store.revoke_token("alice", &"%".repeat(TOKEN_ID_LEN)).await.unwrap());
    assert!(store.revoke_token("alice", &listed[0].id).await.unwrap());
    assert_eq!(store.token_account(&hash('a')).await.unwrap(), None, "revoked");
    assert_eq!(
        store.token_account(&hash('b')).await.unwrap().map(|(u, d)| (u.name, d)),
        Some(("alice".into(), false))
    );
    assert!(store.set_user_disabled("alice", true, true).await.unwrap());
    assert!(!store.set_user_disabled("nobody", true, true).await.unwrap());
    assert_eq!(store.token_account(&hash('b')).await.unwrap().map(|(_, d)| d), Some(true));
    assert_eq!(store.token_account(&hash('c')).await.unwrap().map(|(_, d)| d), Some(false), "bob is not");
    assert_eq!(store.disabled_users().await.unwrap().into_iter().collect::<Vec<_>>(), ["alice"]);
    assert!(store.set_user_disabled("alice", false, true).await.unwrap());
    assert_eq!(store.token_account(&hash('b')).await.unwrap().map(|(_, d)| d), Some(false));
}

/// Disabling holds a user's queued work or not, enabling releases it; deleting removes every token of the
/// user at once, keeps their tasks, retires the name (not made again, not updated, not disabled or enabled)
/// and is done once.
async fn users_are_held_and_deleted(store: Store, _: String) {
    use trainyard_store::AccountState;
    for name in ["alice", "bob"] {
        let u = User { name: name.into(), role: "member".into(), groups: vec!["nlp".into()] };
        assert!(store.put_user(&u, 1).await.unwrap());
    }
    let hash = |c: char| c.to_string().repeat(64);
    store.add_token(&hash('a'), "alice", "laptop", 2).await.unwrap();
    store.add_token(&hash('b'), "alice", "ci", 3).await.unwrap();
    store.add_token(&hash('c'), "bob", "", 4).await.unwrap();
    assert!(store.account_states().await.unwrap().is_empty(), "nobody is disabled or deleted");
    assert_eq!(store.account_state("alice").await.unwrap(), Some(AccountState::default()));
    assert_eq!(store.account_state("nobody").await.unwrap(), None);

    let held = AccountState { disabled: true, deleted: false, hold_work: true };
    assert!(store.set_user_disabled("alice", true, true).await.unwrap());
    assert_eq!(
        store.account_states().await.unwrap().into_iter().collect::<Vec<_>>(),
        [("alice".into(), held)]
    );
    assert!(store.set_user_disabled("alice", true, false).await.unwrap());
    assert_eq!(store.account_state("alice").await.unwrap(), Some(AccountState { hold_work: false, ..held }));
    // Enabling releases the hold, whatever it was.
    assert!(store.set_user_disabled("alice", true, true).await.unwrap());
    assert!(store.set_user_disabled("alice", false, true).await.unwrap());
    assert_eq!(store.account_state("alice").await.unwrap(), Some(AccountState::default()));

    store.create_task(&new_task("q1", "alice", "nlp", 10)).await.unwrap();
    store.create_task(&new_task("q2", "alice", "nlp", 11)).await.unwrap();
    store.create_task(&new_task("b1", "bob", "nlp", 12)).await.unwrap();
    let queued = store.owner_tasks_in_status("alice", &[Status::Queued, Status::Running]).await.unwrap();
    assert_eq!(queued.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["q1", "q2"]);
    assert!(store.owner_tasks_in_status("alice", &[Status::Running]).await.unwrap().is_empty());
    assert!(store.owner_tasks_in_status("alice", &[]).await.unwrap().is_empty());

    assert!(store.delete_user("alice", true, 20).await.unwrap());
    assert!(!store.delete_user("alice", true, 21).await.unwrap(), "deleted once");
    assert!(!store.delete_user("nobody", true, 21).await.unwrap());
    assert_eq!(store.token_account(&hash('a')).await.unwrap(), None, "every token gone");
    assert_eq!(store.token_account(&hash('b')).await.unwrap(), None);
    assert!(store.list_tokens("alice").await.unwrap().is_empty());
    assert_eq!(
        store.token_account(&hash('c')).await.unwrap().map(|(u, d)| (u.name, d)),
        Some(("bob".into(), false))
    );
    let deleted = AccountState { disabled: true, deleted: true, hold_work: true };
    assert_eq!(store.account_state("alice").await.unwrap(), Some(deleted));
    assert_eq!(
        store.account_states().await.unwrap().into_iter().collect::<Vec<_>>(),
        [("alice".into(), deleted)]
    );
    assert_eq!(store.get_user("alice").await.unwrap(), None, "a deleted user is no user");
    assert!(store.list_users().await.unwrap().iter().any(|u| u.name == "alice"), "but the name is kept");
    // The name is retired: not made again, not changed, not enabled.
    let again = User { name: "alice".into(), role: "admin".into(), groups: vec![] };
    assert!(!store.put_user(&again, 30).await.unwrap());
    assert!(!store.set_user_disabled("alice", false, false).await.unwrap());
    assert_eq!(store.account_state("alice").await.unwrap(), Some(deleted));
    assert_eq!(store.list_users().await.unwrap().iter().find(|u| u.name == "alice").unwrap().role, "member");
    // A token added for the name (by a caller that did not check) would not sign in.
    store.add_token(&hash('d'), "alice", "", 31).await.unwrap();
    assert_eq!(store.token_account(&hash('d')).await.unwrap(), None);
    // The tasks stay, for the record.
    assert!(store.get_task("q1").await.unwrap().is_some());
    assert_eq!(store.owner_tasks_in_status("alice", &[Status::Queued]).await.unwrap().len(), 2);
}

/// What the one-time re-sealing of hidden values reads and writes.
async fn specs_and_hidden_task_env_for_resealing(store: Store, _: String) {
    use trainyard_store::TaskEnvVar;
    let mut t = new_task("t1", "alice", "nlp", 1);
    t.spec_json = r#"{"v": "sealed:v1:00"}"#.into();
    store.create_task(&t).await.unwrap();
    store.create_task(&new_task("t2", "alice", "nlp", 2)).await.unwrap();
    let found = store.tasks_with_spec_containing("sealed:v1:").await.unwrap();
    assert_eq!(found.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["t1"]);
    store.replace_spec("t1", r#"{"v": "sealed:v2:00"}"#).await.unwrap();
    assert!(store.tasks_with_spec_containing("sealed:v1:").await.unwrap().is_empty());
    assert_eq!(store.get_task("t1").await.unwrap().unwrap().spec_json, r#"{"v": "sealed:v2:00"}"#);
    assert!(store.replace_spec("nope", "{}").await.is_err());
    let var = |n: &str, hidden| TaskEnvVar { name: n.into(), value: "x".into(), hidden };
    store.put_task_env("alice", &var("A", true)).await.unwrap();
    store.put_task_env("alice", &var("B", false)).await.unwrap();
    let hidden = store.hidden_task_env().await.unwrap();
    assert_eq!(hidden, [("alice".to_owned(), var("A", true))]);
}

async fn changes_since(store: Store, _: String) {
    store.create_task(&new_task("old", "alice", "nlp", 10)).await.unwrap();
    store.create_task(&new_task("new", "alice", "nlp", 100)).await.unwrap();
    store.create_task(&new_task("gone", "alice", "nlp", 100)).await.unwrap();
    store.delete_task("gone", 150).await.unwrap();
    let changed = store.tasks_updated_since(50).await.unwrap();
    let seen: Vec<(&str, &str)> = changed.iter().map(|t| (t.id.as_str(), t.status.as_str())).collect();
    assert_eq!(seen, [("new", "Queued"), ("gone", "Queued")]);
    assert_eq!(changed.iter().map(|t| t.deleted).collect::<Vec<_>>(), [false, true], "deleted ones say so");
    assert!(changed.iter().all(|t| t.spec_json.is_empty()));
    // The same, light: versions first, then records only for the ids asked for.
    let mut versions = store.versions_updated_since(50).await.unwrap();
    versions.sort_by(|a, b| a.id.cmp(&b.id));
    let seen: Vec<(&str, i64, &str, bool)> =
        versions.iter().map(|v| (v.id.as_str(), v.created_at_ms, v.status.as_str(), v.deleted)).collect();
    assert_eq!(seen, [("gone", 100, "Queued", true), ("new", 100, "Queued", false)]);
    assert_eq!(versions[0].version, changed[1].version, "a version as the full record has it");
    let mut active = store.versions_in_status(&[Status::Queued]).await.unwrap();
    active.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(
        active.iter().map(|v| (v.id.as_str(), v.deleted)).collect::<Vec<_>>(),
        [("gone", true), ("new", false), ("old", false)],
        "a deleted task's included, flagged"
    );
    let mut ids: Vec<String> = (0..1200).map(|i| format!("none-{i}")).collect();
    ids.extend(["gone".to_owned(), "new".to_owned()]);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut records = store.tasks_without_spec(&refs).await.unwrap();
    records.sort_by(|a, b| a.id.cmp(&b.id));
    let seen: Vec<(&str, bool)> = records.iter().map(|t| (t.id.as_str(), t.deleted)).collect();
    assert_eq!(seen, [("gone", true), ("new", false)], "unknown ids left out");
    assert!(records.iter().all(|t| t.spec_json.is_empty()));
    // Their specs, in bulk, by id (unknown ids left out); more ids than one query takes.
    let mut ids: Vec<String> = (0..1200).map(|i| format!("none-{i}")).collect();
    ids.extend(["old".to_owned(), "new".to_owned()]);
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let specs = store.specs_of(&refs).await.unwrap();
    assert_eq!(specs.keys().collect::<Vec<_>>(), ["new", "old"]);
    assert_eq!(specs["new"], "{\"id\":\"new\"}");

    // Avoided nodes: recorded once, read back for tasks in the statuses asked for.
    store.avoid_node("new", "node-b", 120).await.unwrap();
    store.avoid_node("new", "node-b", 121).await.unwrap();
    store.avoid_node("new", "node-a", 122).await.unwrap();
    store.avoid_node("gone", "node-c", 160).await.unwrap();
    let avoided = store.avoided_nodes(&[Status::Queued, Status::Running]).await.unwrap();
    let pair = |t: &str, n: &str| (t.to_owned(), n.to_owned());
    assert_eq!(avoided, [pair("new", "node-a"), pair("new", "node-b")], "a deleted task's are left out");
    assert!(store.avoided_nodes(&[Status::Running]).await.unwrap().is_empty());
    // A read after a write sees it (SQLite's reader keeps its connections between reads).
    store.delete_task("new", 160).await.unwrap();
    let again = store.versions_updated_since(155).await.unwrap();
    assert_eq!(again.iter().map(|v| (v.id.as_str(), v.deleted)).collect::<Vec<_>>(), [("new", true)]);
    let queued = store.versions_in_status(&[Status::Queued]).await.unwrap();
    assert!(queued.iter().any(|v| v.id == "new" && v.deleted), "{queued:?}");
}

async fn task_env(store: Store, _: String) {
    let v = |n: &str, val: &str, hidden| TaskEnvVar { name: n.into(), value: val.into(), hidden };
    store.put_task_env("alice", &v("B", "2", false)).await.unwrap();
    store.put_task_env("alice", &v("A", "1", true)).await.unwrap();
    store.put_task_env("alice", &v("A", "one", true)).await.unwrap();
    store.put_task_env("bob", &v("A", "x", false)).await.unwrap();
    assert_eq!(store.task_env("alice").await.unwrap(), [v("A", "one", true), v("B", "2", false)]);
    assert!(store.delete_task_env("alice", "B").await.unwrap());
    assert!(!store.delete_task_env("alice", "B").await.unwrap());
    assert_eq!(store.task_env("alice").await.unwrap().len(), 1);
}

async fn settings(store: Store, _: String) {
    assert_eq!(store.get_setting("catalog").await.unwrap(), None);
    store.put_setting("catalog", "regions: {}", 1).await.unwrap();
    store.put_setting("catalog", "regions: {a: {}}", 2).await.unwrap();
    assert_eq!(store.get_setting("catalog").await.unwrap().as_deref(), Some("regions: {a: {}}"));
}

async fn users_and_tokens(store: Store, _: String) {
    assert_eq!(store.count_users().await.unwrap(), 0);
    let alice = User { name: "alice".into(), role: "member".into(), groups: vec!["nlp".into()] };
    store.put_user(&alice, 1).await.unwrap();
    store.add_token("hash-a", "alice", "laptop", 2).await.unwrap();
    assert_eq!(store.user_for_token("hash-a").await.unwrap(), Some(alice.clone()));
    assert_eq!(store.user_for_token("hash-b").await.unwrap(), None);
    let promoted = User { role: "admin".into(), groups: vec!["nlp".into(), "cv".into()], ..alice };
    store.put_user(&promoted, 3).await.unwrap();
    assert_eq!(store.get_user("alice").await.unwrap(), Some(promoted.clone()));
    assert!(promoted.viewer().admin);
    assert_eq!(store.count_users().await.unwrap(), 1);
    assert!(store.add_token("hash-a", "alice", "again", 4).await.is_err(), "a token hash is unique");
}

fn new_task(id: &str, owner: &str, group: &str, at: i64) -> NewTask {
    NewTask {
        id: id.into(),
        name: format!("name-{id}"),
        owner: owner.into(),
        project_group: group.into(),
        task_type: "PyTorchJob".into(),
        status: Status::Queued,
        public: false,
        labels: BTreeMap::new(),
        spec_json: format!("{{\"id\":\"{id}\"}}"),
        created_at_ms: at,
        idempotency: None,
        first_event: Some((Reason::Submitted, "submitted".into())),
        demand: None,
    }
}

async fn create_get_and_idempotency(store: Store, _: String) {
    let mut t = new_task("a1", "alice", "nlp", 100);
    t.labels.insert("team".into(), "nlp".into());
    t.idempotency = Some(("key-1".into(), "hash-1".into()));
    let created = store.create_task(&t).await.unwrap();
    assert!(matches!(created, Created::New(_)));
    let got = store.get_task("a1").await.unwrap().unwrap();
    assert_eq!(&got, created.task());
    assert_eq!((got.version, got.attempt, got.status.as_str()), (1, 0, "Queued"));
    assert_eq!(got.labels.get("team").map(String::as_str), Some("nlp"));
    assert_eq!(store.get_task("nope").await.unwrap(), None);

    // A retry: same key, same body, even with a new id, gives the first task back.
    let mut retry = new_task("a2", "alice", "nlp", 101);
    retry.idempotency = Some(("key-1".into(), "hash-1".into()));
    match store.create_task(&retry).await.unwrap() {
        Created::Existing(e) => assert_eq!(e.id, "a1"),
        other => panic!("{other:?}"),
    }
    // Same key, other body: refused. Another owner's key space is separate.
    retry.idempotency = Some(("key-1".into(), "hash-2".into()));
    assert!(matches!(store.create_task(&retry).await, Err(StoreError::IdempotencyConflict)));
    let mut bob = new_task("b1", "bob", "nlp", 102);
    bob.idempotency = Some(("key-1".into(), "hash-9".into()));
    assert!(matches!(store.create_task(&bob).await.unwrap(), Created::New(_)));
    // Names are unique; a failed create writes nothing.
    let mut dup = new_task("a3", "alice", "nlp", 103);
    dup.name = "name-a1".into();
    dup.idempotency = Some(("key-3".into(), "h".into()));
    assert!(matches!(store.create_task(&dup).await, Err(StoreError::NameTaken(_))));
    assert_eq!(store.get_task("a3").await.unwrap(), None);
    dup.name = "name-a3".into();
    assert!(
        matches!(store.create_task(&dup).await.unwrap(), Created::New(_)),
        "the key of the failed create is free"
    );
    assert_eq!(store.count_tasks().await.unwrap(), 3);
    let events = store.list_events("a1", 0, 100).await.unwrap();
    assert_eq!(events.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), ["Submitted"]);
}

/// Two servers on one database (or a server and another process on SQLite's file): a key stored through
/// one is seen through the other, and the same key sent through both at once makes one task.
async fn keys_stored_through_another_handle_are_seen(store: Store, url: String) {
    let other = Store::connect(&url).await.unwrap();
    let mut t = new_task("h1", "alice", "nlp", 100);
    t.idempotency = Some(("shared".into(), "body".into()));
    assert!(matches!(store.create_task(&t).await.unwrap(), Created::New(_)));
    assert!(other.idempotency_key_used("alice", "shared").await.unwrap());
    let mut retry = new_task("h2", "alice", "nlp", 101);
    retry.idempotency = Some(("shared".into(), "body".into()));
    match other.create_task(&retry).await.unwrap() {
        Created::Existing(e) => assert_eq!(e.id, "h1"),
        c => panic!("{c:?}"),
    }
    retry.idempotency = Some(("shared".into(), "another body".into()));
    assert!(matches!(other.create_task(&retry).await, Err(StoreError::IdempotencyConflict)));
    // And the other way round, a key first stored through the second handle.
    let mut back = new_task("h3", "alice", "nlp", 102);
    back.idempotency = Some(("back".into(), "body".into()));
    assert!(matches!(other.create_task(&back).await.unwrap(), Created::New(_)));
    let mut again = new_task("h4", "alice", "nlp", 103);
    again.idempotency = Some(("back".into(), "body".into()));
    assert_eq!(store.create_task(&again).await.unwrap().task().id, "h3");
    // Both at once, many times: one task per key.
    for round in 0..20 {
        let key = format!("race-{round}");
        let send = |s: &Store, id: String| {
            let (s, key) = (s.clone(), key.clone());
            async move {
                let mut t = new_task(&id, "alice", "nlp", 200 + round);
                t.idempotency = Some((key, "body".into()));
                s.create_task(&t).await.unwrap().task().id.clone()
            }
        };
        let (a, b) = tokio::join!(
            tokio::spawn(send(&store, format!("ra{round}"))),
            tokio::spawn(send(&other, format!("rb{round}")))
        );
        assert_eq!(a.unwrap(), b.unwrap(), "round {round}");
    }
    assert_eq!(store.count_tasks().await.unwrap(), 2 + 20);
}

async fn concurrent_retries_create_one_task(store: Store, _: String) {
    let mut handles = Vec::new();
    for i in 0..32 {
        let store = store.clone();
        handles.push(tokio::spawn(async move {
            let mut t = new_task(&format!("c{i}"), "carol", "nlp", 200);
            t.name = format!("retry-{i}");
            t.idempotency = Some(("same-key".into(), "same-body".into()));
            store.create_task(&t).await.unwrap()
        }));
    }
    let mut ids = std::collections::BTreeSet::new();
    let mut new = 0;
    for h in handles {
        let c = h.await.unwrap();
        new += usize::from(matches!(c, Created::New(_)));
        ids.insert(c.task().id.clone());
    }
    assert_eq!((new, ids.len()), (1, 1), "exactly one task, returned to every retry");
    assert_eq!(store.count_tasks().await.unwrap(), 1);
}

/// Creates that arrive together are written by one group commit (multi-row statements when all are new);
/// a retried key, a reused key with another body or a taken name in the same burst is answered alone and
/// costs the others nothing.
async fn a_burst_of_creates_answers_each_alone(store: Store, _: String) {
    let mut taken = new_task("t0", "dave", "nlp", 300);
    taken.name = "taken".into();
    store.create_task(&taken).await.unwrap();
    let mut old = new_task("k0", "dave", "nlp", 300);
    old.idempotency = Some(("old-key".into(), "body-a".into()));
    store.create_task(&old).await.unwrap();

    for round in 0..2 {
        // Round 0: only new tasks (the multi-row path). Round 1: new tasks mixed with every kind of conflict.
        let mut burst = Vec::new();
        for i in 0..150 {
            let mut t = new_task(&format!("r{round}-{i}"), "dave", "nlp", 400 + i);
            t.labels.insert("burst".into(), format!("{round}"));
            t.labels.insert("i".into(), format!("{i}"));
            t.idempotency = Some((format!("key-{round}-{i}"), "body".into()));
            burst.push(t);
        }
        if round == 1 {
            let mut retry = new_task("r1-retry", "dave", "nlp", 600);
            retry.idempotency = Some(("old-key".into(), "body-a".into()));
            let mut conflict = new_task("r1-conflict", "dave", "nlp", 601);
            conflict.idempotency = Some(("old-key".into(), "body-b".into()));
            let mut name = new_task("r1-name", "dave", "nlp", 602);
            name.name = "taken".into();
            let mut twice = new_task("r1-twice", "dave", "nlp", 603);
            twice.idempotency = Some(("key-1-7".into(), "body".into()));
            burst.splice(40..40, [retry, conflict, name, twice]);
        }
        let handles: Vec<_> = burst
            .into_iter()
            .map(|t| {
                let store = store.clone();
                tokio::spawn(async move { (t.id.clone(), store.create_task(&t).await) })
            })
            .collect();
        for h in handles {
            let (id, got) = h.await.unwrap();
            match (id.as_str(), got) {
                ("r1-retry", Ok(Created::Existing(t))) => assert_eq!(t.id, "k0"),
                ("r1-conflict", Err(StoreError::IdempotencyConflict)) => {}
                ("r1-name", Err(StoreError::NameTaken(n))) => assert_eq!(n, "taken"),
                // The same key twice in one burst: whichever came second gets the first one's task.
                ("r1-twice", Ok(Created::Existing(t))) => assert_eq!(t.id, "r1-7"),
                ("r1-7", Ok(Created::Existing(t))) => assert_eq!(t.id, "r1-twice"),
                (id, Ok(Created::New(t))) if id.starts_with('r') => {
                    assert_eq!(t.id, id);
                    let got = store.get_task(id).await.unwrap().expect("a created task is stored");
                    assert_eq!(got, t);
                    assert_eq!(got.labels.len(), 2, "{id}");
                    let events = store.list_events(id, 0, 10).await.unwrap();
                    assert_eq!(events.iter().map(|e| e.reason.as_str()).collect::<Vec<_>>(), ["Submitted"]);
                }
                (id, other) => panic!("{id}: {other:?}"),
            }
        }
    }
    // 2 before, 150 + 150 new, plus one of the same-key pair counted once.
    assert_eq!(store.count_tasks().await.unwrap(), 2 + 150 + 150 + 1 - 1);
    for name in ["r1-conflict", "r1-name"] {
        assert_eq!(store.get_task(name).await.unwrap(), None, "a refused create writes nothing");
    }
    let labelled = store
        .list_tasks(
            &TaskFilter { labels: vec![("burst".into(), "1".into())], ..Default::default() },
            None,
            500,
        )
        .await
        .unwrap();
    assert_eq!(labelled.items.len(), 150, "label rows of every new task in the burst are written");
}

/// While creates stream in from many callers (the group-commit writer always has a batch in hand), the
/// process's other writes (events, transitions, settings) all go through and none is lost: on SQLite they
/// take their turns with the writer's batches. A deadlock between the writer's thread and the runtime's
/// writes would end this test at its bound instead of hanging. (How long they wait is a figure for
/// `api-bench`, whose control-loop line shows the loop's admissions keeping up, not an assertion here.)
async fn other_writes_take_turns_with_a_stream_of_creates(store: Store, _: String) {
    store.create_task(&new_task("w0", "erin", "nlp", 1)).await.unwrap();
    let streams: Vec<_> = (0..8)
        .map(|c| {
            let store = store.clone();
            tokio::spawn(async move {
                for i in 0..60 {
                    let t = new_task(&format!("s{c}-{i}"), "erin", "nlp", 10 + i);
                    assert!(matches!(store.create_task(&t).await, Ok(Created::New(_))));
                }
            })
        })
        .collect();
    let others = async {
        for i in 0..30 {
            store.append_event("w0", 0, 100 + i, Reason::Submitted, &format!("note {i}")).await.unwrap();
            store.put_setting("turns", &format!("{i}"), 100 + i).await.unwrap();
        }
        let t = store
            .transition(&Transition {
                task_id: "w0".into(),
                expected_version: 1,
                status: Status::Admitted,
                attempt: 1,
                at_ms: 200,
                reason: Reason::Admitted,
                message: "admitted".into(),
                placement: Some("{}".into()),
                retries: None,
            })
            .await
            .unwrap();
        assert_eq!(t.status, Status::Admitted);
    };
    tokio::time::timeout(std::time::Duration::from_secs(120), async {
        others.await;
        for s in streams {
            s.await.unwrap();
        }
    })
    .await
    .expect("creates and other writes all finish");
    assert_eq!(store.count_tasks().await.unwrap(), 1 + 8 * 60);
    assert_eq!(store.list_events("w0", 0, 100).await.unwrap().len(), 1 + 30 + 1);
    assert_eq!(store.get_setting("turns").await.unwrap().as_deref(), Some("29"));
}

async fn list_pages_in_every_sort_order(store: Store, _: String) {
    use trainyard_store::SortOrder;
    // Names out of creation order, and several tasks at one time.
    for i in 0..17 {
        let mut t = new_task(&format!("s{i:02}"), "alice", "cv", 1000 + i / 3);
        t.name = format!("n{:02}", (i * 7) % 17);
        store.create_task(&t).await.unwrap();
    }
    for sort in [SortOrder::Newest, SortOrder::Oldest, SortOrder::Name, SortOrder::Updated] {
        let filter = TaskFilter { sort, ..Default::default() };
        let mut seen = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = store.list_tasks(&filter, cursor.as_deref(), 4).await.unwrap();
            seen.extend(page.items);
            match page.next_cursor {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        assert_eq!(seen.len(), 17, "{sort:?}: every task once");
        let keys: Vec<(String, String)> = seen
            .iter()
            .map(|t| match sort {
                SortOrder::Newest | SortOrder::Oldest => (format!("{:020}", t.created_at_ms), t.id.clone()),
                SortOrder::Updated => (format!("{:020}", t.updated_at_ms), t.id.clone()),
                SortOrder::Name => (t.name.clone(), t.id.clone()),
            })
            .collect();
        let mut want = keys.clone();
        want.sort();
        if matches!(sort, SortOrder::Newest | SortOrder::Updated) {
            want.reverse();
        }
        assert_eq!(keys, want, "{sort:?}");
    }
    assert!(store.list_tasks(&TaskFilter::default(), Some("nonsense"), 4).await.is_err());
}

async fn list_pages_newest_first_with_filters(store: Store, _: String) {
    for i in 0..25 {
        let mut t = new_task(
            &format!("t{i:02}"),
            if i % 2 == 0 { "alice" } else { "bob" },
            if i % 3 == 0 { "cv" } else { "nlp" },
            1000 + i / 2,
        );
        if i % 5 == 0 {
            t.status = Status::Running;
            t.task_type = "RayJob".into();
        }
        t.labels.insert("exp".into(), format!("e{}", i % 4));
        store.create_task(&t).await.unwrap();
    }
    // All pages, newest first, each task once (equal times are ordered by id).
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store.list_tasks(&TaskFilter::default(), cursor.as_deref(), 7).await.unwrap();
        assert!(page.items.len() <= 7);
        seen.extend(page.items.iter().map(|t| (t.created_at_ms, t.id.clone())));
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(seen.len(), 25);
    let mut sorted = seen.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(seen, sorted);

    let count = |f: TaskFilter| {
        let store = store.clone();
        async move { store.list_tasks(&f, None, 100).await.unwrap().items.len() }
    };
    assert_eq!(count(TaskFilter { owner: Some("alice".into()), ..Default::default() }).await, 13);
    assert_eq!(count(TaskFilter { project_groups: vec!["cv".into()], ..Default::default() }).await, 9);
    assert_eq!(count(TaskFilter { status: Some(Status::Running), ..Default::default() }).await, 5);
    assert_eq!(count(TaskFilter { task_type: Some("RayJob".into()), ..Default::default() }).await, 5);
    assert_eq!(count(TaskFilter { search: Some("t1".into()), ..Default::default() }).await, 10);
    assert_eq!(count(TaskFilter { search: Some("t07".into()), ..Default::default() }).await, 1);
    // LIKE wildcards in a search are literal.
    assert_eq!(count(TaskFilter { search: Some("t_".into()), ..Default::default() }).await, 0);
    // A whole id or name finds that task alone (and only where the other filters let it through).
    let found = |f: TaskFilter| {
        let store = store.clone();
        async move {
            let items = store.list_tasks(&f, None, 100).await.unwrap().items;
            assert!(items.iter().all(|t| t.spec_json.is_empty()), "lists leave specs out");
            items.into_iter().map(|t| t.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(found(TaskFilter { search: Some("name-t12".into()), ..Default::default() }).await, ["t12"]);
    assert_eq!(found(TaskFilter { search: Some("t12".into()), ..Default::default() }).await, ["t12"]);
    let other_owner =
        TaskFilter { search: Some("t12".into()), owner: Some("bob".into()), ..Default::default() };
    assert!(found(other_owner).await.is_empty(), "t12 is alice's");
    assert_eq!(found(TaskFilter { search: Some("name-t1".into()), ..Default::default() }).await.len(), 10);
    assert_eq!(
        count(TaskFilter { labels: vec![("exp".into(), "e1".into())], ..Default::default() }).await,
        6
    );
    assert_eq!(
        count(TaskFilter {
            labels: vec![("exp".into(), "e1".into())],
            owner: Some("bob".into()),
            ..Default::default()
        })
        .await,
        6
    );
    assert!(store.list_tasks(&TaskFilter::default(), Some("garbage"), 5).await.is_err());
}

async fn visibility_is_decided_in_the_query(store: Store, _: String) {
    let mut private = new_task("p", "alice", "nlp", 1);
    private.public = false;
    let mut public = new_task("q", "alice", "nlp", 2);
    public.public = true;
    store.create_task(&private).await.unwrap();
    store.create_task(&public).await.unwrap();
    store.share("p", "dave", false).await.unwrap();
    let sees = |user: &str, groups: &[&str], admin: bool| {
        let store = store.clone();
        let viewer =
            Viewer { user: user.into(), groups: groups.iter().map(|g| g.to_string()).collect(), admin };
        async move {
            let page = store
                .list_tasks(&TaskFilter { visible_to: Some(viewer.clone()), ..Default::default() }, None, 100)
                .await
                .unwrap();
            let mut ids: Vec<String> = page.items.into_iter().map(|t| t.id).collect();
            ids.sort();
            for id in ["p", "q"] {
                let t = store.get_task(id).await.unwrap().unwrap();
                assert_eq!(store.visible(&t, &viewer).await.unwrap(), ids.contains(&id.to_owned()), "{id}");
            }
            ids
        }
    };
    assert_eq!(sees("alice", &[], false).await, ["p", "q"], "owner");
    assert_eq!(sees("admin", &[], true).await, ["p", "q"], "admin");
    assert_eq!(sees("bob", &["nlp"], false).await, ["q"], "member sees only the public one");
    assert_eq!(sees("erin", &["cv"], false).await, Vec::<String>::new(), "another group sees nothing");
    assert_eq!(sees("dave", &["cv"], false).await, ["p"], "shared with dave");
    assert!(!store.may_operate("p", "dave").await.unwrap());
    store.share("p", "dave", true).await.unwrap();
    assert!(store.may_operate("p", "dave").await.unwrap());
    store.share("p", "carol", false).await.unwrap();
    assert_eq!(store.shares("p").await.unwrap(), [("carol".to_owned(), false), ("dave".to_owned(), true)]);
    // Taken back: dave sees and operates it no more; a second take-back finds nothing.
    assert!(store.unshare("p", "dave").await.unwrap());
    assert!(!store.unshare("p", "dave").await.unwrap());
    assert!(!store.may_operate("p", "dave").await.unwrap());
    assert_eq!(sees("dave", &["cv"], false).await, Vec::<String>::new(), "no longer shared with dave");
    assert_eq!(store.shares("p").await.unwrap(), [("carol".to_owned(), false)]);
}

async fn transitions_check_the_version_and_record_events(store: Store, _: String) {
    store.create_task(&new_task("x", "alice", "nlp", 10)).await.unwrap();
    let step = |v: i64, status: &str, reason: &str| Transition {
        task_id: "x".into(),
        expected_version: v,
        status: Status::from_name(status).unwrap(),
        attempt: 1,
        at_ms: 20 + v,
        reason: Reason::from_name(reason).unwrap(),
        message: format!("now {status}"),
        placement: (status == "Admitted").then(|| "{\"nodes\":[\"n0\"]}".to_owned()),
        retries: None,
    };
    let t = store.transition(&step(1, "Admitted", "Admitted")).await.unwrap();
    assert_eq!((t.version, t.status.as_str(), t.updated_at_ms), (2, "Admitted", 21));
    assert_eq!(t.placement, "{\"nodes\":[\"n0\"]}");
    // A writer that read version 1 loses.
    assert!(matches!(
        store.transition(&step(1, "Running", "Started")).await,
        Err(StoreError::VersionConflict { expected: 1 })
    ));
    let t = store.transition(&step(2, "Running", "Started")).await.unwrap();
    assert_eq!(t.placement, "{\"nodes\":[\"n0\"]}", "a transition without a placement keeps it");
    let mut retry = step(3, "Queued", "Requeued");
    retry.placement = Some(String::new());
    retry.retries = Some(1);
    let t = store.transition(&retry).await.unwrap();
    assert_eq!((t.placement.as_str(), t.retries), ("", 1));
    let t = store.transition(&step(4, "Running", "Started")).await.unwrap();
    assert_eq!(t.retries, 1);
    store.append_event("x", 1, 30, Reason::PrecheckPassed, "gemm 210 TFLOP/s").await.unwrap();
    let mut missing = step(1, "Running", "Started");
    missing.task_id = "nope".into();
    assert!(matches!(store.transition(&missing).await, Err(StoreError::NotFound(_))));
    let events = store.list_events("x", 0, 100).await.unwrap();
    let reasons: Vec<&str> = events.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(reasons, ["Submitted", "Admitted", "Started", "Requeued", "Started", "PrecheckPassed"]);
    assert!(events.windows(2).all(|w| w[0].seq < w[1].seq));
    let after = store.list_events("x", events[1].seq, 100).await.unwrap();
    assert_eq!(after.len(), 4);
    let running = store.tasks_in_status(&[Status::Running, Status::Queued]).await.unwrap();
    assert_eq!(running.iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["x"]);

    // Several in one commit: y through two steps (the second names the version after the first), a stale
    // change to x refused on its own, z unknown; the others still apply.
    store.create_task(&new_task("y", "alice", "nlp", 11)).await.unwrap();
    let on = |id: &str, v: i64, status: &str| {
        let reason = if status == "Stopping" { "StopRequested" } else { "Admitted" };
        Transition { task_id: id.into(), ..step(v, status, reason) }
    };
    let answers = store
        .transitions(&[
            on("y", 1, "Admitted"),
            on("x", 1, "Stopping"),
            on("y", 2, "Starting"),
            on("z", 1, "Admitted"),
        ])
        .await
        .unwrap();
    assert!(matches!(&answers[0], Ok(t) if t.version == 2 && t.status == Status::Admitted));
    assert!(matches!(answers[1], Err(StoreError::VersionConflict { expected: 1 })));
    assert!(matches!(&answers[2], Ok(t) if t.version == 3 && t.status == Status::Starting));
    assert!(matches!(answers[3], Err(StoreError::NotFound(_))));
    let y: Vec<String> = store.list_events("y", 0, 10).await.unwrap().into_iter().map(|e| e.reason).collect();
    assert_eq!(y, ["Submitted", "Admitted", "Admitted"]);
    assert_eq!(
        store.get_task("x").await.unwrap().unwrap().status,
        Status::Running,
        "the refused change wrote nothing"
    );
    assert!(store.transitions(&[]).await.unwrap().is_empty());
}

async fn deleted_tasks_leave_lists_but_keep_history(store: Store, _: String) {
    store.create_task(&new_task("d", "alice", "nlp", 10)).await.unwrap();
    assert!(!store.is_deleted("d").await.unwrap());
    store.delete_task("d", 50).await.unwrap();
    assert!(store.is_deleted("d").await.unwrap());
    assert!(!store.is_deleted("nope").await.unwrap());
    assert!(store.list_tasks(&TaskFilter::default(), None, 10).await.unwrap().items.is_empty());
    assert!(store.get_task("d").await.unwrap().is_some());
    assert_eq!(store.list_events("d", 0, 10).await.unwrap().len(), 1);
    assert!(matches!(store.delete_task("nope", 1).await, Err(StoreError::NotFound(_))));
}

async fn reopening_keeps_everything(store: Store, url: String) {
    let mut t = new_task("r", "alice", "nlp", 10);
    t.idempotency = Some(("k".into(), "h".into()));
    store.create_task(&t).await.unwrap();
    drop(store);
    // A second open runs the migrations again (a no-op) and sees the data.
    let again = Store::connect(&url).await.unwrap();
    assert_eq!(again.get_task("r").await.unwrap().unwrap().id, "r");
    assert!(matches!(again.create_task(&t).await.unwrap(), Created::Existing(_)));
}

/// SQLite in memory is refused: each connection would have a database of its own.
#[tokio::test]
async fn an_in_memory_sqlite_database_is_refused() {
    for url in ["sqlite::memory:", "sqlite://file:x?mode=memory&cache=shared"] {
        assert!(matches!(Store::connect(url).await, Err(StoreError::BadUrl(_))), "{url}");
    }
}

/// Issue 33: one holder at a time, a new token for each term, and a fenced store's status changes and events
/// refused once its term ended, with nothing written; a handle on the same database (another server) sees it.
async fn the_lease_has_one_holder_and_fences_the_writes_of_an_ended_term(store: Store, url: String) {
    let other = Store::connect(&url).await.unwrap();
    let before = store.lease().await.unwrap();
    assert_eq!((before.holder.as_str(), before.token), ("", 0));
    let a = store.claim_lease("a", 60_000).await.unwrap().expect("a free lease is taken");
    assert_eq!((a.holder.as_str(), a.token), ("a", 1));
    assert!(a.held_by("a") && a.expires_at_ms >= a.now_ms + 59_000);
    // Another server cannot take a lease that runs; its holder renews it in the same term.
    assert_eq!(other.claim_lease("b", 60_000).await.unwrap(), None);
    let renewed = store.claim_lease("a", 60_000).await.unwrap().unwrap();
    assert_eq!((renewed.token, renewed.acquired_at_ms), (1, a.acquired_at_ms));

    store.create_task(&new_task("x", "alice", "nlp", 10)).await.unwrap();
    let step = |v: i64, status: Status| Transition {
        task_id: "x".into(),
        expected_version: v,
        status,
        attempt: 1,
        at_ms: 20 + v,
        reason: Reason::Admitted,
        message: "admitted".into(),
        placement: None,
        retries: None,
    };
    let fence_a = Fence::default();
    let leader_a = store.fenced(fence_a.clone());
    // No token yet: nothing commits.
    assert!(matches!(
        leader_a.transition(&step(1, Status::Admitted)).await,
        Err(StoreError::Fenced { held: 0, .. })
    ));
    fence_a.set(a.token, far());
    leader_a.transition(&step(1, Status::Admitted)).await.unwrap();
    leader_a.append_event("x", 1, 25, Reason::PrecheckPassed, "of term 1").await.unwrap();

    // a stops renewing: its lease expires (a short one here), and b takes the next term.
    store.claim_lease("a", 1).await.unwrap().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let b = other.claim_lease("b", 60_000).await.unwrap().expect("an expired lease is taken");
    assert_eq!((b.holder.as_str(), b.token), ("b", 2));
    let fence_b = Fence::default();
    fence_b.set(b.token, far());
    let leader_b = other.fenced(fence_b.clone());

    // a, resumed, still believes it leads: its writes are refused and nothing of them is stored.
    let refused = leader_a.transition(&step(2, Status::Running)).await;
    assert!(matches!(refused, Err(StoreError::Fenced { held: 1, current: 2 })), "{refused:?}");
    assert!(matches!(
        leader_a.append_event("x", 1, 26, Reason::PrecheckPassed, "of term 1, late").await,
        Err(StoreError::Fenced { held: 1, current: 2 })
    ));
    assert_eq!(store.get_task("x").await.unwrap().unwrap().version, 2);
    // b's go through; and a cannot take the lease back while b's term runs.
    leader_b.transition(&step(2, Status::Running)).await.unwrap();
    assert_eq!(store.claim_lease("a", 60_000).await.unwrap(), None);
    let messages: Vec<String> =
        store.list_events("x", 0, 100).await.unwrap().into_iter().map(|e| e.message).collect();
    assert!(messages.contains(&"of term 1".to_owned()) && !messages.contains(&"of term 1, late".to_owned()));
    // A term past its end by this process's clock writes nothing, whatever the store says.
    fence_b.set(b.token, std::time::Instant::now());
    assert!(matches!(
        leader_b.transition(&step(3, Status::Stopping)).await,
        Err(StoreError::Fenced { held: 0, .. })
    ));
    // Unfenced writes (the API's: a user's stop) go through whoever leads.
    store.transition(&step(3, Status::Stopping)).await.unwrap();

    // Released, the lease is taken at once by the next server, in a new term.
    assert!(other.release_lease("b", 2).await.unwrap());
    assert!(!other.release_lease("b", 1).await.unwrap(), "only the term's own token releases it");
    let c = store.claim_lease("c", 60_000).await.unwrap().expect("a released lease is free");
    assert_eq!(c.token, 3);
}

async fn servers_and_shared_settings(store: Store, url: String) {
    let other = Store::connect(&url).await.unwrap();
    let record = |id: &str, started: i64| ServerRecord {
        id: id.into(),
        address: format!("http://{id}:8080"),
        host: "h".into(),
        backend: "fake".into(),
        version: "0.1.0".into(),
        started_at_ms: started,
        seen_at_ms: 0,
    };
    store.server_seen(&record("s1", 1)).await.unwrap();
    other.server_seen(&record("s2", 2)).await.unwrap();
    store.server_seen(&record("s1", 1)).await.unwrap();
    let seen = other.servers(60_000).await.unwrap();
    assert_eq!(seen.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["s1", "s2"]);
    assert!(seen.iter().all(|s| s.seen_at_ms > 0));
    // Not seen within the window: forgotten.
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    assert!(store.servers(1).await.unwrap().is_empty());

    // The first value set wins, on every handle.
    assert_eq!(store.setting_once("k", "first", 1).await.unwrap(), "first");
    assert_eq!(other.setting_once("k", "second", 2).await.unwrap(), "first");
}

/// A term's end, far away.
fn far() -> std::time::Instant {
    std::time::Instant::now() + std::time::Duration::from_secs(3600)
}

/// A replica's log is kept in chunks with its follower's cursor, one commit each, and read from any offset.
async fn a_kept_log_is_read_from_any_offset_with_its_cursor(s: Store, _url: String) {
    assert!(s.kept_read_log("t", 0, "m", 0, 100).await.unwrap().missing);
    s.kept_add_replica("t", 0, "m", "master").await.unwrap();
    s.kept_add_replica("t", 0, "m", "worker").await.unwrap();
    s.kept_append_log("t", 0, "m", "a\nbb\n", "c1").await.unwrap();
    s.kept_append_log("t", 0, "m", "", "c2").await.unwrap();
    s.kept_append_log("t", 0, "m", "ccc\n", "c3").await.unwrap();
    let r = s.kept_replica("t", 0, "m").await.unwrap().unwrap();
    assert_eq!((r.role.as_str(), r.cursor.as_str(), r.log_bytes, r.ended), ("master", "c3", 9, false));
    let all = s.kept_read_log("t", 0, "m", 0, 100).await.unwrap();
    assert_eq!((all.data.as_slice(), all.from, all.log_bytes), (&b"a\nbb\nccc\n"[..], 0, 9));
    // From the middle of the second chunk: that chunk, from its start.
    let part = s.kept_read_log("t", 0, "m", 6, 100).await.unwrap();
    assert_eq!((part.data.as_slice(), part.from), (&b"ccc\n"[..], 5));
    s.kept_end("t", 0, "m").await.unwrap();
    let end = s.kept_read_log("t", 0, "m", 9, 100).await.unwrap();
    assert!(end.ended && end.data.is_empty() && !end.missing, "{end:?}");
    assert_eq!(s.kept_replicas("t", 0).await.unwrap().len(), 1);
    // Appends to a replica never recorded are refused.
    assert!(matches!(s.kept_append_log("t", 0, "x", "a\n", "").await, Err(StoreError::NotFound(_))));
}

async fn kept_metrics_are_read_by_replica_after_a_time(s: Store, _url: String) {
    s.kept_add_replica("t", 1, "w", "worker").await.unwrap();
    s.kept_add_replica("t", 1, "m", "master").await.unwrap();
    assert!(
        s.kept_append_metrics("t", 1, "w", &[(10, "w10".into()), (20, "w20".into())], 100).await.unwrap()
    );
    assert!(s.kept_append_metrics("t", 1, "m", &[(15, "m15".into())], 100).await.unwrap());
    let got = s.kept_read_metrics("t", 1, 10).await.unwrap();
    assert_eq!(got, [("m".to_owned(), "m15".to_owned()), ("w".to_owned(), "w20".to_owned())]);
    assert!(s.kept_read_metrics("t", 0, 0).await.unwrap().is_empty());
    // Past the cap: nothing of the batch is kept.
    assert!(!s.kept_append_metrics("t", 1, "m", &[(30, "m30".into()), (40, "m40".into())], 8).await.unwrap());
    assert!(s.kept_append_metrics("t", 1, "m", &[(30, "m30".into())], 8).await.unwrap());
    let m: Vec<String> = s.kept_read_metrics("t", 1, 0).await.unwrap().into_iter().map(|(_, v)| v).collect();
    assert_eq!(m, ["m15", "m30", "w10", "w20"]);
}

/// What a server keeps of replicas is fenced like its status changes: one that does not lead keeps nothing.
async fn a_server_that_does_not_lead_keeps_nothing_of_replicas(s: Store, _url: String) {
    let lease = s.claim_lease("one", 60_000).await.unwrap().unwrap();
    let fence = Fence::default();
    let fenced = s.fenced(fence.clone());
    // No term held: refused, nothing written.
    assert!(matches!(fenced.kept_add_replica("t", 0, "m", "master").await, Err(StoreError::Fenced { .. })));
    assert!(s.kept_replicas("t", 0).await.unwrap().is_empty());
    fence.set(lease.token, std::time::Instant::now() + std::time::Duration::from_secs(60));
    fenced.kept_add_replica("t", 0, "m", "master").await.unwrap();
    fenced.kept_append_log("t", 0, "m", "a\n", "c").await.unwrap();
    // A stale term (another took the lease since): refused, nothing written.
    fence.set(lease.token - 1, std::time::Instant::now() + std::time::Duration::from_secs(60));
    assert!(matches!(fenced.kept_append_log("t", 0, "m", "b\n", "d").await, Err(StoreError::Fenced { .. })));
    assert!(matches!(fenced.kept_end("t", 0, "m").await, Err(StoreError::Fenced { .. })));
    let r = s.kept_replica("t", 0, "m").await.unwrap().unwrap();
    assert_eq!((r.log_bytes, r.cursor.as_str(), r.ended), (2, "c", false));
}
