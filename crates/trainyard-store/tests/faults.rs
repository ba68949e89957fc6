//! Faults of the disk under a SQLite store, for real: a filesystem that fills up (a small tmpfs, mounted
//! here, which needs root: without it the test says so and does nothing) and a WAL damaged while the store
//! was stopped. Real files and real SQLite, no mocks.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;
use trainyard_core::lifecycle::{Reason, Status};
use trainyard_store::*;

/// How long one write may take before the test calls it hung (a write that waits on a lock never released
/// waits SQLite's busy timeout, 30 s, and then fails).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

fn unique(prefix: &str) -> PathBuf {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    std::env::temp_dir().join(format!("{prefix}{}-{}", std::process::id(), t % 1_000_000_000))
}

fn new_task(id: &str, at: i64, pad: usize) -> NewTask {
    NewTask {
        id: id.into(),
        name: format!("name-{id}"),
        owner: "alice".into(),
        project_group: "nlp".into(),
        task_type: "PyTorchJob".into(),
        status: Status::Queued,
        public: false,
        labels: BTreeMap::new(),
        spec_json: format!("{{\"id\":\"{id}\",\"pad\":\"{}\"}}", "x".repeat(pad)),
        created_at_ms: at,
        idempotency: None,
        first_event: Some((Reason::Submitted, "submitted".into())),
        demand: None,
    }
}

/// A tmpfs of `size` mounted on a new directory, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` (having said why) where mounting is not allowed.
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = unique("trainyard-full-");
        std::fs::create_dir_all(&dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir)),
            other => {
                let said = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
                    Err(e) => e.to_string(),
                };
                eprintln!(
                    "SKIPPED: filling a disk for real needs a small tmpfs, and mounting one needs root ({said})"
                );
                let _ = std::fs::remove_dir(&dir);
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Writes `path` until the filesystem has no byte left.
fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    for chunk in [64 * 1024, 4096, 512, 1] {
        let bytes = vec![7u8; chunk];
        while f.write_all(&bytes).is_ok() {}
    }
    let _ = f.sync_all();
}

/// What one write answered, within [`WRITE_TIMEOUT`]: acknowledged (`true`), refused for the full disk
/// (`false`); anything else (a hang, another error, "corrupt") fails the test.
async fn full_or_ok<T: std::fmt::Debug>(what: &str, write: impl Future<Output = Result<T>>) -> bool {
    match tokio::time::timeout(WRITE_TIMEOUT, write).await {
        Ok(Ok(_)) => true,
        Ok(Err(e @ StoreError::DiskFull(_))) => {
            let said = e.to_string();
            assert!(said.contains("full") && said.contains("free space"), "{what}: {said}");
            assert!(!said.contains("corrupt"), "{what}: {said}");
            false
        }
        Ok(Err(e)) => panic!("{what} while the disk is full answered {e:?} ({e}), not the disk-full error"),
        Err(_) => panic!("{what} while the disk is full hung for {WRITE_TIMEOUT:?}"),
    }
}

/// While the disk is full every write fails promptly with the disk-full error (never "corrupt", never a
/// hang), the health check says the store cannot write, and nothing is acknowledged that is not stored.
/// Once space is freed, writes succeed on the same store with no restart (no connection was left inside a
/// transaction holding the write lock) and the health check clears.
///
/// Before the fix (tried, 4 of 4 runs): creates answered "stored data is corrupt: commit failed: database
/// or disk is full"; after a failed transition, a pool connection stayed inside its transaction, so later
/// transitions "succeeded" into it (lost at the next open) and settings hung until SQLite's 30 s lock wait
/// ran out; after space was freed, creates answered "database is locked".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_writes_plainly_and_needs_no_restart_once_freed() {
    let Some(fs) = Tmpfs::mount("4m") else { return };
    let url = format!("sqlite://{}", fs.0.join("trainyard.db").display());
    let store = Store::connect(&url).await.unwrap();
    for i in 0..10 {
        store.create_task(&new_task(&format!("a{i:02}"), i, 100)).await.unwrap();
    }
    assert_eq!(store.write_health().await, Ok(()));
    fill(&fs.0.join("filler"));

    // Every kind of write, a few times: the create writer's batches, the pool's transactions and single
    // statements. Each either fails as a full disk or is acknowledged (and then must be stored).
    let (mut created, mut moved, mut set) = (Vec::new(), Vec::new(), Vec::new());
    let mut refused = 0;
    for round in 0..4 {
        let t = new_task(&format!("b{round}"), 100 + round, 20_000);
        if full_or_ok("a create", store.create_task(&t)).await {
            created.push(t.id.clone());
        } else {
            refused += 1;
        }
        let change = Transition {
            task_id: format!("a{round:02}"),
            expected_version: 1,
            status: Status::Running,
            attempt: 0,
            at_ms: 1_000,
            reason: Reason::Started,
            message: "m".repeat(20_000),
            placement: Some("node-0".into()),
            retries: None,
        };
        if full_or_ok("a transition", store.transition(&change)).await {
            moved.push(change.task_id.clone());
        } else {
            refused += 1;
        }
        let name = format!("big-{round}");
        if full_or_ok("a setting", store.put_setting(&name, &"v".repeat(20_000), 5)).await {
            set.push(name);
        } else {
            refused += 1;
        }
    }
    assert!(refused >= 6, "most writes to a full disk fail ({refused} of 12 did)");
    let why = store.write_health().await.expect_err("the health check fails while writes fail");
    assert!(why.contains("full"), "{why}");

    // Space again: the same store writes at once.
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    let t = new_task("c0", 500, 100);
    let after = tokio::time::timeout(WRITE_TIMEOUT, store.create_task(&t)).await;
    assert!(matches!(after, Ok(Ok(Created::New(_)))), "a create once space is freed: {after:?}");
    created.push(t.id);
    let change = Transition {
        task_id: "a09".into(),
        expected_version: 1,
        status: Status::Running,
        attempt: 0,
        at_ms: 2_000,
        reason: Reason::Started,
        message: "started".into(),
        placement: None,
        retries: None,
    };
    let after = tokio::time::timeout(WRITE_TIMEOUT, store.transition(&change)).await;
    assert!(matches!(after, Ok(Ok(_))), "a transition once space is freed: {after:?}");
    moved.push(change.task_id);
    let after = tokio::time::timeout(WRITE_TIMEOUT, store.put_setting("after", "v", 6)).await;
    assert!(matches!(after, Ok(Ok(()))), "a setting once space is freed: {after:?}");
    set.push("after".into());
    assert_eq!(store.write_health().await, Ok(()));

    // Everything acknowledged is committed: read through a second handle, which sees only commits.
    let other = Store::connect(&url).await.unwrap();
    for id in &created {
        assert!(other.get_task(id).await.unwrap().is_some(), "created {id} was acknowledged");
    }
    for id in &moved {
        let task = other.get_task(id).await.unwrap().unwrap();
        assert_eq!(task.status, Status::Running, "{id}'s transition was acknowledged");
    }
    for name in &set {
        assert!(other.get_setting(name).await.unwrap().is_some(), "setting {name} was acknowledged");
    }
    drop((store, other));
}

/// The health check is cheap and true without a fault, and clears by itself (its own small write) once
/// writes would succeed again, even when nothing else writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_check_clears_by_itself_once_space_is_back() {
    let Some(fs) = Tmpfs::mount("4m") else { return };
    let url = format!("sqlite://{}", fs.0.join("trainyard.db").display());
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(store.write_health().await, Ok(()));
    fill(&fs.0.join("filler"));
    let mut failed = false;
    for i in 0..4 {
        failed |= !full_or_ok("a create", store.create_task(&new_task(&format!("f{i}"), i, 20_000))).await;
    }
    assert!(failed, "a create of 20 kB on a full disk fails");
    assert!(store.write_health().await.is_err());
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    tokio::time::sleep(PROBE_EVERY).await;
    assert_eq!(store.write_health().await, Ok(()), "the probe's write succeeds and clears the failure");
}

/// Copies a store's database and WAL (and its WAL index, `-shm`, with `shm`) while it runs with nothing in
/// flight: the files a `kill -9` would leave.
fn copy_files(db: &Path, to: &Path, shm: bool) -> PathBuf {
    std::fs::create_dir_all(to).unwrap();
    let copy = to.join("trainyard.db");
    std::fs::copy(db, &copy).unwrap();
    let mut suffixes = vec!["-wal"];
    if shm {
        suffixes.push("-shm");
    }
    for suffix in suffixes {
        let from = format!("{}{suffix}", db.display());
        std::fs::copy(&from, format!("{}{suffix}", copy.display())).unwrap();
    }
    copy
}

/// The WAL's frame size and number of frames.
fn frames(wal: &[u8]) -> (usize, usize) {
    let page = u32::from_be_bytes(wal[8..12].try_into().unwrap()) as usize;
    (24 + page, (wal.len() - 32) / (24 + page))
}

/// A WAL damaged while the server was stopped (bytes flipped in a committed frame; frames cut off the end
/// while the WAL index still counts them) is refused at open with what is wrong and what to do, before
/// SQLite replays it and drops the acknowledged creates after the damage. An intact copy opens with
/// everything; with `accept_damage` the damaged one opens on what SQLite can replay, the WAL copied aside.
///
/// Before the fix, both damaged copies opened silently, the flipped one without the creates after the
/// damaged frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_wal_is_refused_at_open_with_what_to_do() {
    let dir = unique("trainyard-wal-");
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("trainyard.db");
    let store = Store::connect(&format!("sqlite://{}", db.display())).await.unwrap();
    // One commit each.
    for i in 0..40 {
        store.create_task(&new_task(&format!("t{i:02}"), i, 200)).await.unwrap();
    }
    let url = |p: &Path| format!("sqlite://{}", p.display());

    // Intact: opens, everything there.
    let intact = copy_files(&db, &dir.join("intact"), true);
    let opened = Store::connect(&url(&intact)).await.expect("an intact copy opens");
    assert_eq!(opened.count_tasks().await.unwrap(), 40);
    assert!(opened.opened_despite().is_none());

    // Bytes flipped in the page of a frame a third of the way in (no WAL index: the WAL alone shows it).
    let flipped = copy_files(&db, &dir.join("flipped"), false);
    let wal_path = format!("{}-wal", flipped.display());
    let mut wal = std::fs::read(&wal_path).unwrap();
    let (frame, n) = frames(&wal);
    assert!(n > 60, "the WAL holds the creates' frames ({n})");
    let at = 32 + (n / 3) * frame + 24 + 1000;
    for b in &mut wal[at..at + 8] {
        *b ^= 0x5a;
    }
    std::fs::write(&wal_path, &wal).unwrap();
    let refused = Store::connect(&url(&flipped)).await.expect_err("a damaged WAL is refused");
    assert!(matches!(refused, StoreError::Damaged(_)), "{refused:?}");
    let said = refused.to_string();
    for part in ["damaged", "WAL", "checksum", "would be dropped", "backup", "--accept-store-damage"] {
        assert!(said.contains(part), "{part:?} in: {said}");
    }
    // Opened anyway: SQLite drops the frames after the damage, the creates among them with them. The
    // WAL was kept aside first.
    let open = Open { accept_damage: true };
    let anyway = Store::connect_with(&url(&flipped), open).await.expect("opened when accepted");
    assert!(anyway.opened_despite().is_some_and(|d| d.contains("copied to")));
    let kept = anyway.count_tasks().await.unwrap();
    assert!(kept < 40, "SQLite dropped what followed the damage ({kept} of 40 left)");
    let aside = std::fs::read_dir(dir.join("flipped"))
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().starts_with("trainyard.db-wal.damaged-"));
    assert!(aside, "the damaged WAL was copied aside");

    // Cut short by whole frames: the WAL alone looks like one that ended there, but the WAL index the
    // process left counts the frames cut off.
    let cut = copy_files(&db, &dir.join("cut"), true);
    let wal_path = format!("{}-wal", cut.display());
    let wal = std::fs::read(&wal_path).unwrap();
    let (frame, n) = frames(&wal);
    std::fs::write(&wal_path, &wal[..32 + (n - 20) * frame]).unwrap();
    let refused = Store::connect(&url(&cut)).await.expect_err("a WAL cut short is refused");
    let said = refused.to_string();
    assert!(said.contains("WAL index") && said.contains("cut short"), "{said}");

    drop((store, opened, anyway));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A database file whose pages are damaged (after a checkpoint, so the WAL is sound) is refused by
/// `PRAGMA quick_check` at open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_database_file_is_refused_at_open() {
    let dir = unique("trainyard-pages-");
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("trainyard.db");
    {
        let store = Store::connect(&format!("sqlite://{}", db.display())).await.unwrap();
        for i in 0..200 {
            store.create_task(&new_task(&format!("t{i:03}"), i, 200)).await.unwrap();
        }
    }
    // Checkpointed into the database file and the WAL emptied, from a connection of the test's own, once
    // the store's connections are gone.
    std::thread::sleep(Duration::from_secs(1));
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    drop(conn);
    let mut bytes = std::fs::read(&db).unwrap();
    let page = 4096;
    let pages = bytes.len() / page;
    assert!(pages > 20, "{pages} pages");
    // Garbage over the middle of a few pages past the schema's.
    for p in [pages / 2, pages / 2 + 1, pages - 2] {
        for b in &mut bytes[p * page + 100..p * page + 3000] {
            *b = 0xa5;
        }
    }
    std::fs::write(&db, &bytes).unwrap();
    let refused = Store::connect(&format!("sqlite://{}", db.display())).await.expect_err("refused");
    let said = refused.to_string();
    assert!(matches!(refused, StoreError::Damaged(_)), "{refused:?}");
    assert!(said.contains("quick_check") && said.contains("backup"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}
