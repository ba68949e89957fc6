//! The attempts' logs and metrics, kept in an [`Archive`] so that they outlive the pods (a pod's log goes with
//! the pod, and an ended attempt's job is deleted with its pods): the server's disk ([`FileArchive`], a server
//! alone on its store) or the store that several servers share. Only the server that leads follows and
//! scrapes (see `KubeBackend::capture`).
//!
//! - **Logs.** A follower per pod whose main container has started streams its log through the API server
//!   (`follow`, `timestamps`) into the archive, as the local backend's `TIMESTAMP O TEXT` lines (the log API
//!   merges stdout and stderr). Every second (or 64 KiB) what came is appended with the follower's cursor (the
//!   last timestamp kept, to the nanosecond, and how many lines had it), together. When the stream ends while
//!   the container still runs (a dropped connection, an API server restart), it reconnects from the last
//!   second it kept (`sinceTime`) and skips the lines it has, by that cursor, which also lets a restarted
//!   server, or the next leader, go on where the last one stopped. An append the archive refuses is dropped
//!   with the stream, and read again from the cursor. Once the container has ended and its stream is drained,
//!   the log is marked complete.
//! - **Metrics.** A scraper per running pod of an attempt with metrics endpoints reads each endpoint through
//!   the API server's pod proxy every interval into the archive (the local backend's sample format).
//!
//! What the followers and scrapers send is counted apart from the backend's writes ([`Telemetry`]).

use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use trainyard_runtime::archive::{Archive, Fut, Kept};
use trainyard_runtime::clock::now_ms;
use trainyard_runtime::metrics::{self, Point};
use trainyard_runtime::{AttemptKey, LogChunk, MetricPoint};

/// The most a pod's kept log may hold; past it a last line says so and no more is kept.
pub const MAX_LOG_BYTES: u64 = 256 << 20;
/// The longest line kept: a longer one is cut there (a task's output is untrusted: a line without an end must
/// not grow in the server's memory).
pub const MAX_LINE_BYTES: usize = 64 << 10;
/// The longest wait before a follower reconnects to a container that still runs.
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// Follow streams a server holds open at once (the API server proxies each to a kubelet); past that, pods wait
/// their turn (first come, first served), and a stream open for [`HOLD`] gives way when others wait.
pub const MAX_LOG_STREAMS: usize = 512;
const HOLD: Duration = Duration::from_secs(300);

/// The metrics endpoints of an attempt's replicas, as the job's annotation keeps them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Scrape {
    /// (port, path) on each pod.
    pub endpoints: Vec<(u16, String)>,
    pub interval_s: u64,
}

/// Requests the followers and scrapers sent (log streams opened, scrapes).
#[derive(Debug, Default)]
pub struct Telemetry {
    pub log_requests: AtomicU64,
    pub scrapes: AtomicU64,
}

/// Where a pod's container is, for its follower.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PodNow {
    Runs,
    /// Its main container has ended: what the log API returns now is the whole log.
    Ended,
    /// The pod is gone (or the backend is): nothing more can be read.
    Gone,
}

/// The pod a follower or scraper works for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct Target {
    pub(super) key: AttemptKey,
    pub(super) namespace: String,
    pub(super) pod: String,
    pub(super) container: String,
    /// The replica's role (`driver` for a RayJob's driver).
    pub(super) role: String,
}

/// The kept logs and metrics as files on the server's disk: `DIR/TASK/ATTEMPT/POD.{role,log,cursor,ended,
/// metrics.jsonl}`.
#[derive(Debug, Clone)]
pub struct FileArchive {
    dir: PathBuf,
}

/// A task id as a file name (ids are the server's own, but nothing read from the cluster names a path as is).
fn component(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect()
}

impl FileArchive {
    pub fn new(dir: PathBuf) -> FileArchive {
        FileArchive { dir }
    }

    fn attempt_dir(&self, key: &AttemptKey) -> PathBuf {
        self.dir.join(component(&key.task_id)).join(key.attempt.to_string())
    }

    fn file(&self, key: &AttemptKey, pod: &str, ext: &str) -> PathBuf {
        self.attempt_dir(key).join(format!("{}.{ext}", component(pod)))
    }

    fn add(&self, key: &AttemptKey, pod: &str, role: &str) -> std::io::Result<()> {
        std::fs::create_dir_all(self.attempt_dir(key))?;
        let path = self.file(key, pod, "role");
        if !path.exists() {
            std::fs::write(path, role)?;
        }
        Ok(())
    }

    fn listed(&self, key: &AttemptKey) -> Vec<(String, String)> {
        let Ok(dir) = std::fs::read_dir(self.attempt_dir(key)) else { return Vec::new() };
        let mut out: Vec<(String, String)> = dir
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.strip_suffix(".role")?.to_owned();
                let role = std::fs::read_to_string(e.path()).ok()?;
                Some((name, role))
            })
            .collect();
        out.sort();
        out
    }

    fn record(&self, key: &AttemptKey, pod: &str) -> Option<Kept> {
        let role = std::fs::read_to_string(self.file(key, pod, "role")).ok()?;
        Some(Kept {
            role,
            ended: self.file(key, pod, "ended").exists(),
            cursor: std::fs::read_to_string(self.file(key, pod, "cursor"))
                .unwrap_or_default()
                .trim()
                .to_owned(),
            log_bytes: std::fs::metadata(self.file(key, pod, "log")).map_or(0, |m| m.len()),
        })
    }

    fn append(&self, key: &AttemptKey, pod: &str, lines: &str, cursor: &str) -> std::io::Result<()> {
        if !lines.is_empty() {
            let mut f =
                std::fs::OpenOptions::new().create(true).append(true).open(self.file(key, pod, "log"))?;
            f.write_all(lines.as_bytes())?;
        }
        let path = self.file(key, pod, "cursor");
        let tmp = path.with_extension("cursor.tmp");
        std::fs::write(&tmp, format!("{cursor}\n"))?;
        std::fs::rename(tmp, path)
    }

    fn log(&self, key: &AttemptKey, pod: &str, offset: u64, max: usize) -> LogChunk {
        let ended = self.file(key, pod, "ended").exists();
        let Ok(mut f) = std::fs::File::open(self.file(key, pod, "log")) else {
            return LogChunk { next: offset, ended, missing: !ended, ..LogChunk::default() };
        };
        let len = f.metadata().map_or(0, |m| m.len());
        let offset = offset.min(len);
        let mut data = Vec::new();
        if f.seek(std::io::SeekFrom::Start(offset)).is_ok() {
            let _ = f.take(max as u64).read_to_end(&mut data);
        }
        let (data, next) = trainyard_runtime::archive::cut_log(data, offset, offset, max);
        LogChunk { data, next, ended: ended && next >= len, missing: false }
    }

    fn samples(&self, key: &AttemptKey, since_ms: u64) -> Vec<MetricPoint> {
        let mut out = Vec::new();
        for (pod, _) in self.listed(key) {
            let Ok(text) = std::fs::read_to_string(self.file(key, &pod, "metrics.jsonl")) else { continue };
            for line in text.lines() {
                if let Ok(p) = serde_json::from_str::<Point>(line)
                    && p.t > since_ms
                {
                    out.push(MetricPoint {
                        replica: pod.clone(),
                        at_ms: p.t,
                        name: p.n,
                        labels: p.l,
                        value: p.v,
                    });
                }
            }
        }
        out
    }
}

impl Archive for FileArchive {
    fn add_replica<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        role: &'a str,
    ) -> Fut<'a, Result<(), String>> {
        Box::pin(async move { self.add(key, replica, role).map_err(|e| e.to_string()) })
    }

    fn replicas<'a>(&'a self, key: &'a AttemptKey) -> Fut<'a, Vec<(String, String)>> {
        Box::pin(async move { self.listed(key) })
    }

    fn replica<'a>(&'a self, key: &'a AttemptKey, replica: &'a str) -> Fut<'a, Result<Option<Kept>, String>> {
        Box::pin(async move { Ok(self.record(key, replica)) })
    }

    fn append_log<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        lines: &'a str,
        cursor: &'a str,
    ) -> Fut<'a, Result<(), String>> {
        Box::pin(async move { self.append(key, replica, lines, cursor).map_err(|e| e.to_string()) })
    }

    fn end<'a>(&'a self, key: &'a AttemptKey, replica: &'a str) -> Fut<'a, Result<(), String>> {
        Box::pin(
            async move { std::fs::write(self.file(key, replica, "ended"), b"").map_err(|e| e.to_string()) },
        )
    }

    fn read_log<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        offset: u64,
        max: usize,
    ) -> Fut<'a, LogChunk> {
        Box::pin(async move { self.log(key, replica, offset, max) })
    }

    fn append_metrics<'a>(
        &'a self,
        key: &'a AttemptKey,
        replica: &'a str,
        points: &'a [Point],
    ) -> Fut<'a, Result<(), String>> {
        Box::pin(async move {
            let path = self.file(key, replica, "metrics.jsonl");
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| e.to_string())?;
            metrics::append(&mut f, points);
            Ok(())
        })
    }

    fn read_metrics<'a>(&'a self, key: &'a AttemptKey, since_ms: u64) -> Fut<'a, Vec<MetricPoint>> {
        Box::pin(async move { self.samples(key, since_ms) })
    }
}

// ---- the log follower ----

/// Where a kept log stands: the last timestamp kept (normalised, see [`ts_key`]) and how many kept lines had it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Cursor {
    pub(super) ts: String,
    pub(super) same: u32,
}

impl Cursor {
    /// As the archive keeps it: `TS N` ("" for where a log starts).
    pub(super) fn text(&self) -> String {
        if self.ts.is_empty() { String::new() } else { format!("{} {}", self.ts, self.same) }
    }

    pub(super) fn parse(s: &str) -> Cursor {
        s.trim()
            .split_once(' ')
            .and_then(|(ts, n)| Some(Cursor { ts: ts.to_owned(), same: n.parse().ok()? }))
            .unwrap_or_default()
    }
}

/// Which lines of a stream are new, given the cursor it was opened at: a stream opened with `sinceTime` starts
/// at the cursor's whole second, so it repeats what was kept of that second.
#[derive(Debug, Clone)]
pub(super) struct Dedup {
    from: Cursor,
    seen_at_from: u32,
    pub(super) now: Cursor,
}

impl Dedup {
    pub(super) fn new(c: Cursor) -> Dedup {
        Dedup { from: c.clone(), seen_at_from: 0, now: c }
    }

    /// Whether a line with this timestamp key is new (then it is counted as kept).
    pub(super) fn keep(&mut self, key: &str) -> bool {
        match key.cmp(self.from.ts.as_str()) {
            std::cmp::Ordering::Less => return false,
            std::cmp::Ordering::Equal => {
                self.seen_at_from += 1;
                if self.seen_at_from <= self.from.same {
                    return false;
                }
            }
            std::cmp::Ordering::Greater => {}
        }
        if self.now.ts == key {
            self.now.same += 1;
        } else {
            self.now = Cursor { ts: key.to_owned(), same: 1 };
        }
        true
    }
}

/// An RFC 3339 UTC timestamp as the log API writes it (`2026-01-01T00:00:01.5Z`, fraction trimmed) as a key
/// that sorts in time order: the fraction padded to nanoseconds.
pub(super) fn ts_key(ts: &str) -> Option<String> {
    let b = ts.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[10] != b'T' || b[13] != b':' || !ts.ends_with('Z') {
        return None;
    }
    let (secs, rest) = ts.split_at(19);
    let frac = rest.strip_suffix('Z')?;
    let digits = match frac.strip_prefix('.') {
        Some(d) if d.len() <= 9 && d.bytes().all(|c| c.is_ascii_digit()) => d,
        None if frac.is_empty() => "",
        _ => return None,
    };
    Some(format!("{secs}.{digits:0<9}Z"))
}

/// One line of the log API's answer (`TIMESTAMP TEXT`) as its key and the kept line (`TIMESTAMP_MS O TEXT`).
pub(super) fn log_line(raw: &str) -> Option<(String, String)> {
    let (ts, text) = raw.split_once(' ').unwrap_or((raw, ""));
    let key = ts_key(ts)?;
    Some((key.clone(), format!("{}Z O {text}\n", &key[..23])))
}

/// How long a follow stream may stay open after the container has ended before the follower stops reading
/// (a kubelet ends the stream itself once the log is drained).
const DRAIN: Duration = Duration::from_secs(3);

/// A replica's log in the archive, with what is waiting to be appended.
struct LogSink {
    archive: Arc<dyn Archive>,
    key: AttemptKey,
    pod: String,
    /// The bytes of log the archive holds.
    kept: u64,
    buf: String,
    /// The cursor the archive holds, as it keeps it.
    saved: String,
}

impl LogSink {
    /// The replica's record (made if missing), or why not; `None` when its log is complete.
    async fn open(
        archive: Arc<dyn Archive>,
        key: &AttemptKey,
        pod: &str,
        role: &str,
    ) -> Result<Option<LogSink>, String> {
        let kept = match archive.replica(key, pod).await? {
            Some(k) => k,
            None => {
                archive.add_replica(key, pod, role).await?;
                Kept::default()
            }
        };
        if kept.ended {
            return Ok(None);
        }
        let sink = LogSink {
            archive,
            key: key.clone(),
            pod: pod.to_owned(),
            kept: kept.log_bytes,
            buf: String::new(),
            saved: kept.cursor,
        };
        Ok(Some(sink))
    }

    /// Appends what waits with `cursor`, together. On a refusal what waited is dropped: the follower reads it
    /// again from the saved cursor.
    async fn flush(&mut self, cursor: &str) -> Result<(), String> {
        if self.buf.is_empty() && cursor == self.saved {
            return Ok(());
        }
        let r = self.archive.append_log(&self.key, &self.pod, &self.buf, cursor).await;
        if r.is_ok() {
            self.kept += self.buf.len() as u64;
            self.saved = cursor.to_owned();
        }
        self.buf.clear();
        r
    }
}

/// How one follow stream ended.
enum StreamEnd {
    /// The stream ended, or the container had ended and nothing more came for [`DRAIN`].
    Drained,
    /// The log passed [`MAX_LOG_BYTES`]: nothing more is kept.
    Full,
    /// The archive refused an append: what came since the saved cursor is read again.
    Refused(String),
    /// Open for [`HOLD`] while other pods wait for a stream: it reconnects after them.
    GaveWay,
}

/// Shown each new line of a followed log (its text, without the timestamp): the `preStop` hook's lines become
/// events.
pub(super) type LineHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Follows a pod's log into the archive until its container has ended and the stream is drained, or the pod is
/// gone. `now` says where the pod is.
pub(super) async fn follow(
    client: kube::Client,
    archive: Arc<dyn Archive>,
    t: Target,
    telemetry: Arc<Telemetry>,
    streams: Arc<tokio::sync::Semaphore>,
    now: impl Fn() -> PodNow,
    hook: LineHook,
) {
    let mut backoff = Duration::from_millis(500);
    // The archive may be away for a while (the store restarting): asked again while the pod is there.
    let mut sink = loop {
        match LogSink::open(archive.clone(), &t.key, &t.pod, &t.role).await {
            Ok(Some(sink)) => break sink,
            Ok(None) => return,
            Err(e) if now() == PodNow::Gone => {
                eprintln!("trainyard: cannot keep the log of pod {}/{}: {e}", t.namespace, t.pod);
                return;
            }
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    };
    backoff = Duration::from_millis(500);
    let mut errors = 0u32;
    loop {
        let Ok(permit) = streams.clone().acquire_owned().await else { return };
        // Where the pod was before this read: when it had ended, this read returns the whole log.
        let before = now();
        if before == PodNow::Gone {
            break;
        }
        let cursor = Cursor::parse(&sink.saved);
        let mut uri = format!(
            "/api/v1/namespaces/{}/pods/{}/log?container={}&follow=true&timestamps=true",
            t.namespace, t.pod, t.container
        );
        if cursor.ts.len() >= 19 {
            uri.push_str(&format!("&sinceTime={}Z", &cursor.ts[..19]));
        }
        telemetry.log_requests.fetch_add(1, Ordering::Relaxed);
        let req = http::Request::get(uri).body(Vec::new()).expect("a valid request");
        match client.request_stream(req).await {
            Ok(stream) => {
                let mut dedup = Dedup::new(cursor);
                let end = read_stream(stream, &mut dedup, &mut sink, &now, &streams, &hook).await;
                drop(permit);
                match end {
                    StreamEnd::Full => break,
                    StreamEnd::Refused(e) => {
                        // Not kept (the archive is away, or this server no longer leads): read again later.
                        errors += 1;
                        if errors >= 3 && now() == PodNow::Gone {
                            eprintln!("trainyard: keeping the log of pod {}/{}: {e}", t.namespace, t.pod);
                            return;
                        }
                    }
                    StreamEnd::GaveWay => {
                        errors = 0;
                        continue;
                    }
                    StreamEnd::Drained => {
                        if before == PodNow::Ended || now() != PodNow::Runs {
                            break;
                        }
                        errors = 0;
                    }
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => break,
            Err(e) => {
                drop(permit);
                // Unreachable or refused: a container that has ended gets a few more tries.
                errors += 1;
                if errors >= 3 && now() != PodNow::Runs {
                    eprintln!("trainyard: reading the log of pod {}/{}: {e}", t.namespace, t.pod);
                    break;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    finish(&archive, &t).await;
}

/// Reads up to the next newline into `buf` (without it), keeping at most [`MAX_LINE_BYTES`] and skipping the rest
/// of a longer line (`cut` says so). Ok(true): a whole line; Ok(false): the end of the stream. Cancel-safe: what
/// was read stays in `buf` and `cut`.
async fn read_line(
    r: &mut (impl futures_util::AsyncBufRead + Unpin),
    buf: &mut Vec<u8>,
    cut: &mut bool,
) -> std::io::Result<bool> {
    use futures_util::AsyncBufReadExt;
    loop {
        let avail = r.fill_buf().await?;
        if avail.is_empty() {
            return Ok(false);
        }
        let (take, used, done) = match avail.iter().position(|&b| b == b'\n') {
            Some(i) => (i, i + 1, true),
            None => (avail.len(), avail.len(), false),
        };
        let room = MAX_LINE_BYTES.saturating_sub(buf.len());
        if !*cut {
            buf.extend_from_slice(&avail[..take.min(room)]);
            *cut = take > room;
        }
        r.consume_unpin(used);
        if done {
            return Ok(true);
        }
    }
}

/// Reads one follow stream into the sink, appending what came with the cursor every second (or 64 KiB).
async fn read_stream(
    stream: impl futures_util::AsyncBufRead + Unpin,
    dedup: &mut Dedup,
    sink: &mut LogSink,
    now: &impl Fn() -> PodNow,
    streams: &tokio::sync::Semaphore,
    hook: &LineHook,
) -> StreamEnd {
    let opened = tokio::time::Instant::now();
    let mut stream = stream;
    let (mut raw, mut cut) = (Vec::new(), false);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut ended_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            got = read_line(&mut stream, &mut raw, &mut cut) => {
                let whole = matches!(got, Ok(true));
                if !whole && raw.is_empty() {
                    break;
                }
                let mut text = String::from_utf8_lossy(&raw).into_owned();
                if cut {
                    text.push_str(&format!(" [trainyard: the line was cut at {} KiB]", MAX_LINE_BYTES >> 10));
                }
                raw.clear();
                cut = false;
                let parsed = log_line(&text);
                if !whole {
                    // The stream ended in the middle of a line: keep what came, then stop.
                    if let Some((_, line)) = parsed.filter(|(key, _)| dedup.keep(key)) {
                        sink.buf.push_str(&line);
                    }
                    break;
                }
                let Some((key, line)) = parsed else { continue };
                if !dedup.keep(&key) {
                    continue;
                }
                if sink.kept + (sink.buf.len() + line.len()) as u64 > MAX_LOG_BYTES {
                    sink.buf.push_str(&format!(
                        "{} O trainyard: the log passed {} MiB; no more of it is kept\n",
                        &key[..23],
                        MAX_LOG_BYTES >> 20
                    ));
                    return match sink.flush(&dedup.now.text()).await {
                        Ok(()) => StreamEnd::Full,
                        Err(e) => StreamEnd::Refused(e),
                    };
                }
                if let Some((_, text)) = line.split_once(" O ") {
                    hook(text.trim_end());
                }
                sink.buf.push_str(&line);
                if sink.buf.len() > 64 << 10
                    && let Err(e) = sink.flush(&dedup.now.text()).await
                {
                    return StreamEnd::Refused(e);
                }
            }
            _ = tick.tick() => {
                if let Err(e) = sink.flush(&dedup.now.text()).await {
                    return StreamEnd::Refused(e);
                }
                if opened.elapsed() >= HOLD && streams.available_permits() == 0 {
                    return StreamEnd::GaveWay;
                }
                if now() == PodNow::Runs {
                    ended_at = None;
                } else if ended_at.get_or_insert_with(tokio::time::Instant::now).elapsed() >= DRAIN {
                    break;
                }
            }
        }
    }
    match sink.flush(&dedup.now.text()).await {
        Ok(()) => StreamEnd::Drained,
        Err(e) => StreamEnd::Refused(e),
    }
}

async fn finish(archive: &Arc<dyn Archive>, t: &Target) {
    if let Err(e) = archive.end(&t.key, &t.pod).await {
        eprintln!("trainyard: cannot mark the log of pod {}/{} complete: {e}", t.namespace, t.pod);
    }
}

// ---- a RayJob's driver ----

/// How often a driver's output is read from the head's dashboard.
const DRIVER_POLL: Duration = Duration::from_secs(1);

/// The Ray job API's statuses that end a job.
fn ray_job_over(status: &str) -> bool {
    matches!(status, "SUCCEEDED" | "FAILED" | "STOPPED")
}

/// The lines of `text` past byte `from` to keep now: whole lines, or (`all`, the job is over) everything.
/// Returns the lines and where the next read starts; a text shorter than `from` (another driver's) is read
/// from its start.
pub(super) fn driver_lines(text: &str, from: usize, all: bool) -> (Vec<&str>, usize) {
    let from = if text.is_char_boundary(from) && from <= text.len() { from } else { 0 };
    let rest = &text[from..];
    let upto = if all { rest.len() } else { rest.rfind('\n').map_or(0, |i| i + 1) };
    let lines = rest[..upto].split_inclusive('\n').map(|l| l.trim_end_matches(['\n', '\r'])).collect();
    (lines, from + upto)
}

/// Follows a RayJob's driver (its entrypoint's output), which HTTPMode leaves in the Ray cluster's job logs:
/// every [`DRIVER_POLL`] the head's dashboard is asked, through the API server's pod proxy, for the job's
/// status and its log, whose new whole lines are kept as the replica `t.pod` (the local backend's
/// `TIMESTAMP O TEXT` lines, timed when read). Where it stands (bytes of the Ray log kept) is saved beside
/// the log, so that a restarted server goes on from there. It ends once the job is over and its log read to
/// the end, or when the head is gone; the Ray cluster outlives the job by `objects::DRIVER_DRAIN_S` for that.
pub(super) async fn follow_driver(
    client: kube::Client,
    archive: Arc<dyn Archive>,
    t: Target,
    head: String,
    job_id: String,
    telemetry: Arc<Telemetry>,
    head_now: impl Fn() -> PodNow,
) {
    let mut wait = DRIVER_POLL;
    let mut sink = loop {
        match LogSink::open(archive.clone(), &t.key, &t.pod, &t.role).await {
            Ok(Some(sink)) => break sink,
            Ok(None) => return,
            Err(e) if head_now() == PodNow::Gone => {
                eprintln!("trainyard: cannot keep the driver's log of {}/{}: {e}", t.namespace, head);
                return;
            }
            Err(_) => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(MAX_BACKOFF);
            }
        }
    };
    // Where it stands: the bytes of the Ray log kept.
    let mut from: usize = sink.saved.trim().parse().unwrap_or(0);
    let base = format!("/api/v1/namespaces/{}/pods/{head}:8265/proxy/api/jobs/{job_id}", t.namespace);
    // Looked up once the head is found (KubeRay makes the Secret before the pods that read it); None inside:
    // the cluster has no token.
    let mut token: Option<Option<String>> = None;
    let get = |uri: String, token: Option<String>| {
        let client = client.clone();
        telemetry.log_requests.fetch_add(1, Ordering::Relaxed);
        async move {
            let mut req = http::Request::get(uri);
            if let Some(t) = token {
                // The API server's proxy keeps `Authorization` for itself; Ray reads this one behind proxies.
                req = req.header("X-Ray-Authorization", format!("Bearer {t}"));
            }
            let req = req.body(Vec::new()).expect("a valid request");
            tokio::time::timeout(Duration::from_secs(10), client.request_text(req))
                .await
                .ok()
                .and_then(Result::ok)
        }
    };
    let mut misses = 0u32;
    loop {
        let head_was = head_now();
        if head_was == PodNow::Gone {
            break;
        }
        if token.is_none() {
            token = ray_token(&client, &t.namespace, &head).await;
        }
        let token_now = token.clone().flatten();
        // The status first: a job over by then has all its output in the log read after it.
        let status = get(base.clone(), token_now.clone()).await.and_then(|t| {
            let v: serde_json::Value = serde_json::from_str(&t).ok()?;
            v["status"].as_str().map(str::to_owned)
        });
        let over = status.as_deref().is_some_and(ray_job_over);
        let log = get(format!("{base}/logs"), token_now).await.and_then(|t| {
            let v: serde_json::Value = serde_json::from_str(&t).ok()?;
            v["logs"].as_str().map(str::to_owned)
        });
        if let Some(text) = &log {
            let (lines, next) = driver_lines(text, from, over);
            let at = trainyard_runtime::clock::rfc3339_ms(now_ms());
            for line in lines {
                let mut line = line.to_owned();
                if line.len() > MAX_LINE_BYTES {
                    let mut cut = MAX_LINE_BYTES;
                    while !line.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    line.truncate(cut);
                    line.push_str(&format!(" [trainyard: the line was cut at {} KiB]", MAX_LINE_BYTES >> 10));
                }
                let entry = format!("{at} O {line}\n");
                if sink.kept + (sink.buf.len() + entry.len()) as u64 > MAX_LOG_BYTES {
                    sink.buf.push_str(&format!(
                        "{at} O trainyard: the log passed {} MiB; no more of it is kept\n",
                        MAX_LOG_BYTES >> 20
                    ));
                    if sink.flush(&next.to_string()).await.is_ok() {
                        finish(&archive, &t).await;
                    }
                    return;
                }
                sink.buf.push_str(&entry);
            }
            // The lines and where they end, together; refused, they are read again from where it stood.
            match sink.flush(&next.to_string()).await {
                Ok(()) => from = next,
                Err(e) => {
                    misses += 1;
                    if misses >= 3 && head_now() == PodNow::Gone {
                        eprintln!("trainyard: keeping the driver's log of {}/{head}: {e}", t.namespace);
                        return;
                    }
                    tokio::time::sleep(DRIVER_POLL * misses.clamp(1, 5)).await;
                    continue;
                }
            }
            if over {
                break;
            }
        }
        // Not submitted yet, or the head not answering: asked less often (up to every 5 s) until it does; a
        // head that has ended gets a few more tries.
        if log.is_none() {
            misses += 1;
            if head_was == PodNow::Ended && misses >= 3 {
                break;
            }
        } else {
            misses = 0;
        }
        tokio::time::sleep(DRIVER_POLL * misses.clamp(1, 5)).await;
    }
    finish(&archive, &t).await;
}

/// The Ray cluster's auth token (KubeRay keeps it in a Secret named as the RayCluster, which the head pod's
/// `ray.io/cluster` label names): None when the head could not be read (ask again), Some(None) when the
/// cluster has no token.
async fn ray_token(client: &kube::Client, ns: &str, head: &str) -> Option<Option<String>> {
    use k8s_openapi::api::core::v1::{Pod, Secret};
    let pod = kube::Api::<Pod>::namespaced(client.clone(), ns).get_opt(head).await.ok()??;
    let Some(cluster) = pod.metadata.labels.and_then(|l| l.get("ray.io/cluster").cloned()) else {
        return Some(None);
    };
    let secret = kube::Api::<Secret>::namespaced(client.clone(), ns).get_opt(&cluster).await.ok()?;
    let token = secret.and_then(|s| s.data).and_then(|d| d.get("auth_token").map(|t| t.0.clone()));
    Some(token.and_then(|t| String::from_utf8(t).ok()).map(|t| t.trim().to_owned()))
}

// ---- the metrics scraper ----

/// Scrapes a pod's endpoints through the API server's pod proxy every interval while `running` says so.
pub(super) async fn scrape(
    client: kube::Client,
    archive: Arc<dyn Archive>,
    t: Target,
    s: Scrape,
    telemetry: Arc<Telemetry>,
    running: impl Fn() -> bool,
) {
    if let Err(e) = archive.add_replica(&t.key, &t.pod, &t.role).await {
        eprintln!("trainyard: cannot keep the metrics of pod {}/{}: {e}", t.namespace, t.pod);
        return;
    }
    let interval = Duration::from_secs(s.interval_s.max(1));
    while running() {
        let at = now_ms();
        let mut points = Vec::new();
        for (port, ep) in &s.endpoints {
            let uri = format!("/api/v1/namespaces/{}/pods/{}:{port}/proxy{ep}", t.namespace, t.pod);
            telemetry.scrapes.fetch_add(1, Ordering::Relaxed);
            let req = http::Request::get(uri).body(Vec::new()).expect("a valid request");
            let page = tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await;
            metrics::scraped(at, *port, ep, page.ok().and_then(Result::ok).as_deref(), &mut points);
        }
        // A sample the archive refuses is lost (each is one look at a moving value); the next look is kept.
        let _ = archive.append_metrics(&t.key, &t.pod, &points).await;
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
#[path = "capture_tests.rs"]
mod tests;
