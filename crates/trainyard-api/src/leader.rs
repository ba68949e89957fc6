//! Leadership among several servers on one PostgreSQL store: every server serves the API; the one holding
//! the store's lease (`trainyard_store::Lease`) runs the control loop, the scheduler and the backends.
//!
//! Each server tries to take or renew the lease every [`Election::renew_every`]. The leader counts its term
//! as lasting until the lease's length after the *start* of its last successful renewal, less a margin, by its
//! own monotonic clock: the store's expiry is later than that (it is counted from when the database ran the
//! renewal), so a leader stops acting before anyone else may start. A leader that was paused (SIGSTOP, a
//! stalled VM) finds its term over when it resumes and acts on nothing; a write already on its way is refused
//! by the store's fence. A server alone on a SQLite store (which `trainyard up` locks to one server) leads
//! from the start, without a lease.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use trainyard_store::{Fence, ServerRecord, Store};

/// How long a lease runs without renewal: a dead leader's successor starts acting within about this long.
pub const LEASE: Duration = Duration::from_millis(1_500);
/// How much earlier than the lease's end a leader stops counting on its term.
const MARGIN: Duration = Duration::from_millis(250);
/// A server not seen for this long leaves `GET /api/v1/server`.
pub const SERVER_GONE_AFTER: Duration = Duration::from_secs(30);

/// This server's part in the election; cheap to clone.
#[derive(Clone, Debug)]
pub struct Election(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    /// This server's id in the lease and the registry.
    id: String,
    /// `None`: alone on its store, always leading.
    lease: Option<Duration>,
    fence: Fence,
    term: std::sync::Mutex<Term>,
    /// Signalled when this server's role changes.
    changed: tokio::sync::Notify,
    /// Terms this server won, and terms it lost (the lease taken by another, or not renewed in time).
    won: AtomicU64,
    lost: AtomicU64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Term {
    token: i64,
    /// Until when this server may act (monotonic), while it leads.
    until: Option<Instant>,
    /// When the term began (Unix ms, the database's clock).
    since_ms: i64,
}

/// What a server is now, for the status route and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Role {
    pub leading: bool,
    pub token: i64,
    pub since_ms: i64,
}

impl Election {
    /// A server alone on its store: it leads, always.
    pub fn alone() -> Election {
        Election::with(server_id(), None)
    }

    /// One of several servers on a store: it leads only while it holds the lease ([`Election::run`]).
    pub fn on_lease(lease: Duration) -> Election {
        Election::with(server_id(), Some(lease.max(Duration::from_millis(500))))
    }

    fn with(id: String, lease: Option<Duration>) -> Election {
        Election(Arc::new(Inner {
            id,
            lease,
            fence: Fence::default(),
            term: std::sync::Mutex::new(Term::default()),
            changed: tokio::sync::Notify::new(),
            won: AtomicU64::new(0),
            lost: AtomicU64::new(0),
        }))
    }

    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// Whether this takes part in an election (several servers on the store).
    pub fn elected(&self) -> bool {
        self.0.lease.is_some()
    }

    /// The fence the control loop's writes carry.
    pub fn fence(&self) -> Fence {
        self.0.fence.clone()
    }

    /// How often the lease is taken or renewed: a fifth of its length, so a leader has four more tries.
    pub fn renew_every(&self) -> Duration {
        self.0.lease.map_or(Duration::from_secs(1), |l| l / 5)
    }

    fn term(&self) -> std::sync::MutexGuard<'_, Term> {
        self.0.term.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The token of the term this server leads now, if it does (`Some(0)` alone on its store).
    pub fn leading(&self) -> Option<i64> {
        if self.0.lease.is_none() {
            return Some(0);
        }
        let term = self.term();
        term.until.filter(|&u| Instant::now() < u).map(|_| term.token)
    }

    pub fn role(&self) -> Role {
        let token = self.leading();
        let term = *self.term();
        Role { leading: token.is_some(), token: token.unwrap_or(term.token), since_ms: term.since_ms }
    }

    /// Terms won and lost by this server since it started.
    pub fn terms(&self) -> (u64, u64) {
        (self.0.won.load(Ordering::Relaxed), self.0.lost.load(Ordering::Relaxed))
    }

    /// Waits until this server's role may have changed, or `at_most`.
    pub async fn changed(&self, at_most: Duration) {
        let _ = tokio::time::timeout(at_most, self.0.changed.notified()).await;
    }

    /// Takes part until the process ends: the lease taken or renewed, this server's row in the registry
    /// kept fresh. A server alone on its store writes its row once.
    pub fn spawn(&self, store: Store, me: ServerRecord) -> tokio::task::JoinHandle<()> {
        let election = self.clone();
        tokio::spawn(async move {
            loop {
                if !election.elected() {
                    // Alone on its store: said once (no write a second on an idle embedded store).
                    if let Err(e) = store.server_seen(&me).await {
                        eprintln!("trainyard: recording this server in the store: {e}");
                    }
                    return;
                }
                let next = election.round(&store).await;
                if let Err(e) = store.server_seen(&me).await {
                    eprintln!("trainyard: recording this server in the store: {e}");
                }
                tokio::time::sleep(next.unwrap_or_else(|| election.renew_every())).await;
            }
        })
    }

    /// One try at the lease, and what it changes; when another server holds it, how long until it runs out
    /// (the next try is then made as it does, not up to a renewal period later).
    async fn round(&self, store: &Store) -> Option<Duration> {
        let lease = self.0.lease?;
        let started = Instant::now();
        let claimed = store.claim_lease(&self.0.id, lease.as_millis() as i64).await;
        // The token of the term this server last held (0: none, or it stepped down since).
        let held = self.0.fence.last_token();
        match claimed {
            Ok(Some(l)) => {
                let mut term = self.term();
                term.token = l.token;
                term.since_ms = l.acquired_at_ms;
                let until = started + lease.saturating_sub(MARGIN);
                term.until = Some(until);
                self.0.fence.set(l.token, until);
                drop(term);
                if held != l.token {
                    self.0.won.fetch_add(1, Ordering::Relaxed);
                    println!("trainyard: this server ({}) leads, term {}", self.0.id, l.token);
                    self.0.changed.notify_waiters();
                }
            }
            Ok(None) => {
                if held != 0 {
                    self.step_down("another server holds the lease");
                }
                if let Ok(l) = store.lease().await {
                    let left = u64::try_from(l.expires_at_ms - l.now_ms + 1).unwrap_or(0);
                    return Some(Duration::from_millis(left.max(1)).min(self.renew_every()));
                }
            }
            Err(e) => {
                eprintln!("trainyard: the leader lease: {e}");
                // The term runs out by the clock ([`Election::leading`]); the loop sees that by itself.
                if held != 0 && self.leading().is_none() {
                    self.step_down("its lease could not be renewed in time");
                }
            }
        }
        None
    }

    fn step_down(&self, why: &str) {
        let mut term = self.term();
        term.until = None;
        self.0.fence.clear();
        drop(term);
        self.0.lost.fetch_add(1, Ordering::Relaxed);
        println!("trainyard: this server ({}) no longer leads: {why}", self.0.id);
        self.0.changed.notify_waiters();
    }

    /// Hands the lease over at once (a server stopping), so the next leader need not wait for it to expire.
    pub async fn resign(&self, store: &Store) {
        if let Some(token) = self.leading().filter(|_| self.elected()) {
            self.term().until = None;
            self.0.fence.clear();
            let _ = store.release_lease(&self.0.id, token).await;
        }
    }
}

/// This process's id among the servers: the host, the pid and a random part (a restarted server is a new
/// one).
fn server_id() -> String {
    let host = host_name();
    let random = crate::new_token().map(|t| t.chars().rev().take(8).collect::<String>()).unwrap_or_default();
    format!("{host}-{}-{random}", std::process::id())
}

/// The machine's name.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".to_owned())
}
