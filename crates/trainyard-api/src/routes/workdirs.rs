//! Working directories: a member's directory uploaded for their group's tasks (`trainyard submit --workdir`).
//!
//! Three steps, each refused whole when something is wrong: `check` takes the manifest (every problem at
//! once, the size limits) and answers what the group lacks; `blobs` takes those files as a tar stream named
//! by digest (each written aside and kept only once its content is its name); `commit` keeps the manifest
//! once every file it names is there. The same tree sent again is a check and a commit, no file.

use crate::auth::{Caller, WithBody, may_use_group};
use crate::error::{ApiError, ApiResult, json_object};
use crate::routes::NoParams;
use crate::schema::{object_schema, view};
use crate::state::AppState;
use crate::views::Items;
use axum::Json;
use axum::extract::{Query, State};
use serde::Deserialize;
use trainyard_core::problem::{Code, Report};
use trainyard_workdir::manifest::{Entry, Kind, Manifest, human};
use trainyard_workdir::store::Info;

/// Most bytes of a manifest (about 150 bytes an entry at the most entries a working directory may hold).
pub const MANIFEST_MAX_BYTES: usize = 48 << 20;
/// Bytes a tar stream adds to the files it carries, at most: a header of 512 bytes and padding of up to 511
/// a file, and the end's 1 KiB (the stream's bound is the upload's bound plus this, for every file).
const TAR_OVERHEAD_EACH: u64 = 1024;

impl crate::schema::ApiSchema for Kind {
    fn schema(_: &mut crate::schema::Schemas) -> serde_json::Value {
        serde_json::json!({"type": "string", "enum": ["dir", "file", "link"]})
    }
}

object_schema!(
    /// One entry of a working directory: a directory, a file (its content's SHA-256, its size, whether it
    /// is executable) or a link to a relative path inside the directory. `path` is relative and plain.
    closed Entry as "WorkdirEntry" {
        "path": String,
        "kind": Kind,
        "sha256": crate::schema::Optional<String>,
        "size": crate::schema::Optional<u64>,
        "executable": crate::schema::Optional<bool>,
        "target": crate::schema::Optional<String>,
    }
);

object_schema!(
    /// A working directory's entries.
    closed Manifest as "WorkdirManifest" { "entries": Vec<Entry> }
);

object_schema!(
    /// A working directory the server keeps: its id (the SHA-256 of its canonical manifest), its group, how
    /// many entries and files and bytes, when it was first kept and last used (a submit naming it).
    closed Info as "Workdir" {
        "id": String,
        "projectGroup": String,
        "entries": u64,
        "files": u64,
        "bytes": u64,
        "createdMs": u64,
        "lastUsedMs": u64,
    }
);

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkdirBody {
    #[serde(rename = "projectGroup")]
    project_group: String,
    manifest: Manifest,
}
object_schema!(
    /// A working directory for a project group's tasks: its manifest.
    closed WorkdirBody as "WorkdirUpload" { "projectGroup": String, "manifest": Manifest }
);

view! {
    /// What a check found: the working directory's id, and the files (by SHA-256) the group does not hold
    /// yet, to be sent before the commit. When the group holds them all, the check keeps the working
    /// directory at once (no commit needed) and answers it as `workdir`.
    pub struct WorkdirCheck as "WorkdirCheck" {
        pub id: String,
        pub missing: Vec<String>,
        "missingBytes" pub missing_bytes: u64,
        /// Bytes of all its files.
        pub bytes: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub workdir: Option<Info>,
    }
}

view! {
    /// Files taken in from a tar stream.
    pub struct WorkdirBlobs as "WorkdirBlobs" {
        pub files: u64,
        pub bytes: u64,
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupQuery {
    #[serde(rename = "projectGroup")]
    project_group: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    #[serde(rename = "projectGroup")]
    project_group: Option<String>,
}

/// `f` on a blocking thread (the store's file system work).
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> ApiResult<T> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ApiError::Internal(e.to_string()))
}

fn store(state: &AppState) -> ApiResult<trainyard_workdir::store::Store> {
    state.workdirs.clone().ok_or_else(|| {
        ApiError::NotFoundWhat(
            "this server keeps no working directories (it has no data dir of its own)".into(),
        )
    })
}

/// The manifest's problems and the limits, as one report (each problem at its field).
async fn checked(state: &AppState, body: &WorkdirBody) -> ApiResult<(Vec<(String, u64)>, u64)> {
    let settings = state.settings.get(&state.store).await?;
    let mut report = Report::default();
    for (at, what) in body.manifest.check(settings.workdir_max_bytes) {
        report.error(format!("manifest.{at}"), Code::InvalidValue, what);
    }
    let s = store(state)?;
    let (group, manifest) = (body.project_group.clone(), body.manifest.clone());
    let (missing, usage) = blocking(move || (s.missing(&group, &manifest), s.usage(&group))).await?;
    let adds: u64 = missing.iter().map(|(_, n)| *n).sum();
    if usage.saturating_add(adds) > settings.workdir_group_bytes {
        report.error(
            "manifest",
            Code::InvalidValue,
            format!(
                "project group {} holds {} of working directories and this one adds {}, over the {} a group may \
                 hold (an admin setting, workdirGroupBytes); working directories unused for {} days are \
                 collected",
                body.project_group,
                human(usage),
                human(adds),
                human(settings.workdir_group_bytes),
                settings.workdir_keep_days
            ),
        );
    }
    if !report.is_ok() {
        return Err(ApiError::Invalid(report));
    }
    Ok((missing, adds))
}

/// Checks a working directory's manifest for a group and answers what the group lacks of it.
pub async fn check_workdir(
    State(state): State<AppState>,
    _: Query<NoParams>,
    WithBody(Caller { user, .. }, body): WithBody<Caller>,
) -> ApiResult<Json<WorkdirCheck>> {
    let body: WorkdirBody = json_object(&body, r#"{"projectGroup": GROUP, "manifest": {"entries": [...]}}"#)?;
    may_use_group(&user, &body.project_group)?;
    let (missing, missing_bytes) = checked(&state, &body).await?;
    let (id, bytes) = (body.manifest.id(), body.manifest.bytes());
    // Nothing to send: kept now (a tree sent before costs one request).
    let workdir = if missing.is_empty() {
        let s = store(&state)?;
        let kept = blocking(move || s.commit(&body.project_group, body.manifest)).await?;
        kept.ok()
    } else {
        None
    };
    Ok(Json(WorkdirCheck {
        id,
        missing: missing.into_iter().map(|(d, _)| d).collect(),
        missing_bytes,
        bytes,
        workdir,
    }))
}

/// Takes in files for a group: a tar stream whose entries are named by their content's SHA-256.
pub async fn put_workdir_blobs(
    State(state): State<AppState>,
    Query(q): Query<GroupQuery>,
    Caller { user, .. }: Caller,
    body: axum::body::Body,
) -> ApiResult<Json<WorkdirBlobs>> {
    use futures_util::StreamExt;
    may_use_group(&user, &q.project_group)?;
    let s = store(&state)?;
    let settings = state.settings.get(&state.store).await?;
    let (max_each, group_max) = (settings.workdir_max_bytes, settings.workdir_group_bytes);
    let group = q.project_group.clone();
    let usage = {
        let (s, group) = (s.clone(), group.clone());
        blocking(move || s.usage(&group)).await?
    };
    // The stream is taken in as it arrives (files written aside, kept only once it ended well), bounded by
    // the upload's limit and by what the group may still hold.
    let bound = max_each.saturating_add(max_each / 64).saturating_add(TAR_OVERHEAD_EACH * 1024);
    let room = group_max.saturating_sub(usage).saturating_add(TAR_OVERHEAD_EACH * 1024);
    let (tx, rx) = tokio::sync::mpsc::channel::<axum::body::Bytes>(16);
    let taker = {
        let group = group.clone();
        tokio::task::spawn_blocking(move || {
            s.put_blobs(&group, ChunkReader { rx, at: axum::body::Bytes::new() }, max_each)
        })
    };
    let mut stream = body.into_data_stream();
    let mut got = 0u64;
    let mut refused = None;
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                refused = Some(ApiError::BadRequest(format!("the upload broke off: {e}")));
                break;
            }
        };
        got += chunk.len() as u64;
        if got > bound {
            refused = Some(ApiError::BadRequest(format!(
                "the stream is over the {} an upload may hold (an admin setting, workdirMaxBytes)",
                human(max_each)
            )));
            break;
        }
        if got > room {
            refused = Some(ApiError::BadRequest(format!(
                "project group {group} holds {} of working directories; these files would take it over the {} a \
                 group may hold (an admin setting, workdirGroupBytes)",
                human(usage),
                human(group_max)
            )));
            break;
        }
        // The taker's end is gone only when it refused the stream: its answer says why.
        if tx.send(chunk).await.is_err() {
            break;
        }
    }
    // A refused stream ends short: the taker sees a broken tar and keeps nothing.
    drop(tx);
    let taken = taker.await.map_err(|e| ApiError::Internal(e.to_string()))?;
    if let Some(e) = refused {
        return Err(e);
    }
    let (files, bytes) = taken.map_err(ApiError::BadRequest)?;
    state.metrics.workdir_files(files, bytes);
    Ok(Json(WorkdirBlobs { files, bytes }))
}

/// Keeps a working directory for a group once every file it names is there.
pub async fn commit_workdir(
    State(state): State<AppState>,
    _: Query<NoParams>,
    WithBody(Caller { user, .. }, body): WithBody<Caller>,
) -> ApiResult<Json<Info>> {
    let body: WorkdirBody = json_object(&body, r#"{"projectGroup": GROUP, "manifest": {"entries": [...]}}"#)?;
    may_use_group(&user, &body.project_group)?;
    checked(&state, &body).await?;
    let s = store(&state)?;
    let kept = blocking(move || s.commit(&body.project_group, body.manifest)).await?;
    kept.map(Json).map_err(|missing| {
        ApiError::Conflict(format!(
            "{} of its files are not on the server yet (first: {}); send them (POST /api/v1/workdirs/blobs), then \
             commit again",
            missing.len(),
            missing.first().map_or("", String::as_str)
        ))
    })
}

view! {
    /// A working directory the server keeps, with its manifest.
    pub struct WorkdirContent as "WorkdirContent" {
        pub workdir: Info,
        pub manifest: Manifest,
    }
}

/// Who reads a working directory: a member of its group (or an admin), or the replicas of an attempt of a
/// task that names it, with that attempt's token (`tyw.…`, made at launch for a backend whose replicas fetch
/// it: Kubernetes) while the attempt holds its resources. An ended attempt's token, another task's working
/// directory, another group's: refused alike (404 for a token, so it learns nothing of what exists).
#[derive(Debug)]
pub enum Reader {
    Member(trainyard_store::User),
    Attempt { group: String, workdir: String },
}

impl axum::extract::FromRequestParts<AppState> for Reader {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &AppState,
    ) -> ApiResult<Reader> {
        use trainyard_control::secrets::WORKDIR_TOKEN_PREFIX;
        let sent = parts.headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        let Some(token) = sent
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| t.starts_with(WORKDIR_TOKEN_PREFIX))
        else {
            let Caller { user, .. } = Caller::from_request_parts(parts, state).await?;
            return Ok(Reader::Member(user));
        };
        let (task_id, attempt) = state.secrets.workdir_token_attempt(token).ok_or(ApiError::Unauthorized)?;
        let t = state.store.get_task(&task_id).await?.ok_or(ApiError::Unauthorized)?;
        if t.deleted || t.attempt != attempt || !t.status.holds_resources() {
            return Err(ApiError::Unauthorized);
        }
        let spec: serde_json::Value = serde_json::from_str(&t.spec_json).unwrap_or_default();
        let workdir = spec["spec"]["environment"]["workdir"].as_str().unwrap_or_default().to_owned();
        Ok(Reader::Attempt { group: t.project_group, workdir })
    }
}

impl Reader {
    /// Whether this reader may read the group's working directory `id`.
    fn may_read(&self, group: &str, id: &str) -> ApiResult<()> {
        match self {
            Reader::Member(user) => may_use_group(user, group),
            Reader::Attempt { group: g, workdir } if g == group && workdir == id => Ok(()),
            Reader::Attempt { .. } => Err(ApiError::NotFound),
        }
    }
}

fn valid_id(id: &str) -> ApiResult<()> {
    if !trainyard_workdir::manifest::is_id(id) {
        return Err(ApiError::NotFoundWhat(format!(
            "{id:?} is not a working directory's id (64 hex digits)"
        )));
    }
    Ok(())
}

/// One working directory and its manifest.
pub async fn get_workdir(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<GroupQuery>,
    reader: Reader,
) -> ApiResult<Json<WorkdirContent>> {
    valid_id(&id)?;
    reader.may_read(&q.project_group, &id)?;
    let s = store(&state)?;
    let group = q.project_group;
    let found = blocking(move || Some((s.info(&group, &id)?, s.manifest(&group, &id)?))).await?;
    let (workdir, manifest) = found.ok_or_else(|| {
        ApiError::NotFoundWhat(
            "no such working directory in this project group (unused ones are collected)".into(),
        )
    })?;
    Ok(Json(WorkdirContent { workdir, manifest }))
}

/// The files of one working directory as a tar stream, each content once, named by its SHA-256 (as uploads
/// send them): what a replica's fetch checks and makes its `/workspace` from.
pub async fn get_workdir_files(
    State(state): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    Query(q): Query<GroupQuery>,
    reader: Reader,
) -> ApiResult<axum::response::Response> {
    valid_id(&id)?;
    reader.may_read(&q.project_group, &id)?;
    let s = store(&state)?;
    let (probe, group, i) = (s.clone(), q.project_group.clone(), id.clone());
    // Asked first, so that a working directory that is not there is a 404, not a stream that breaks off.
    if !blocking(move || probe.info(&group, &i).is_some()).await? {
        return Err(ApiError::NotFoundWhat(
            "no such working directory in this project group (unused ones are collected)".into(),
        ));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<axum::body::Bytes>>(8);
    let metrics = state.metrics.clone();
    tokio::task::spawn_blocking(move || {
        let mut w = ChunkWriter { tx: tx.clone(), buf: Vec::with_capacity(CHUNK) };
        match s.write_files(&q.project_group, &id, &mut w) {
            Ok(bytes) => metrics.workdir_sent(bytes),
            // The stream ends broken: the reader sees a short tar, never a wrong one.
            Err(e) => {
                let _ = tx.blocking_send(Err(std::io::Error::other(e)));
            }
        }
    });
    let body = axum::body::Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|c| (c, rx))
    }));
    axum::response::Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "application/octet-stream")
        .body(body)
        .map_err(|e| ApiError::Internal(e.to_string()))
}

/// What the tar stream is sent in.
const CHUNK: usize = 256 << 10;

/// A blocking writer that hands its bytes to a response body in chunks.
struct ChunkWriter {
    tx: tokio::sync::mpsc::Sender<std::io::Result<axum::body::Bytes>>,
    buf: Vec<u8>,
}

impl std::io::Write for ChunkWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = axum::body::Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the reader went away"))
    }
}

/// The working directories of the caller's groups (an admin's: every group's), or of one group.
pub async fn list_workdirs(
    State(state): State<AppState>,
    Query(q): Query<ListQuery>,
    Caller { user, .. }: Caller,
) -> ApiResult<Json<Items<Info>>> {
    let s = store(&state)?;
    let groups: Vec<String> = match &q.project_group {
        Some(g) => {
            may_use_group(&user, g)?;
            vec![g.clone()]
        }
        None if user.role == "admin" => {
            let s = s.clone();
            blocking(move || s.groups()).await?
        }
        None => user.groups.clone(),
    };
    let items = blocking(move || groups.iter().flat_map(|g| s.list(g)).collect::<Vec<_>>()).await?;
    Ok(Json(items.into()))
}

/// A submission's working directory: its group must hold it; its use is marked (collection counts from the
/// last). Err: the problem at `spec.environment.workdir`.
pub async fn use_workdir(state: &AppState, group: &str, id: &str) -> ApiResult<()> {
    let missing = || {
        let mut r = Report::default();
        r.error(
            "spec.environment.workdir",
            Code::InvalidValue,
            format!(
                "project group {group} has no working directory {id}: upload it with `trainyard submit --workdir \
                 DIR` (unused ones are collected)"
            ),
        );
        ApiError::Invalid(r)
    };
    if let crate::backends::AnyBackend::Kube(k) = &state.backend
        && !k.members().iter().all(trainyard_kube::KubeBackend::fetches_workdirs)
    {
        let mut r = Report::default();
        r.error(
            "spec.environment.workdir",
            Code::InvalidValue,
            "this server's pods cannot fetch a working directory: its admin starts it with \
             --kube-workdir-image and --kube-workdir-url (or put the code in the image or on a volume)",
        );
        return Err(ApiError::Invalid(r));
    }
    let Some(s) = state.workdirs.clone() else { return Err(missing()) };
    let (g, i) = (group.to_owned(), id.to_owned());
    let found = blocking(move || s.touch(&g, &i)).await?;
    if found { Ok(()) } else { Err(missing()) }
}

/// Gives group `to` the working directory `id` of group `from` (a clone into another group), within `to`'s
/// limit. Err: the problem at `spec.environment.workdir`.
pub async fn copy_to_group(state: &AppState, from: &str, to: &str, id: &str) -> ApiResult<()> {
    let settings = state.settings.get(&state.store).await?;
    let s = store(state)?;
    let (f, t, i) = (from.to_owned(), to.to_owned(), id.to_owned());
    let copied = blocking(move || s.copy_to(&f, &t, &i, settings.workdir_group_bytes)).await?;
    copied.map(|_| ()).map_err(|why| {
        let mut r = Report::default();
        r.error("spec.environment.workdir", Code::InvalidValue, why);
        ApiError::Invalid(r)
    })
}

/// A blocking reader over the chunks of a request body, for the tar reader on a blocking thread.
struct ChunkReader {
    rx: tokio::sync::mpsc::Receiver<axum::body::Bytes>,
    at: axum::body::Bytes,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.at.is_empty() {
            match self.rx.blocking_recv() {
                Some(next) => self.at = next,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.at.len());
        buf[..n].copy_from_slice(&self.at.split_to(n));
        Ok(n)
    }
}
