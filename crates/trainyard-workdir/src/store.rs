//! The server's side: working directories kept per project group under one directory of the server's.
//!
//! ```text
//! ROOT/GROUP_HEX/blobs/AB/DIGEST   a file's content, named by its SHA-256 (0600, root's)
//! ROOT/GROUP_HEX/trees/ID.json     a manifest, named by its id; its mtime is its last use
//! ROOT/GROUP_HEX/tmp/              what is being written: renamed in once whole and checked
//! ```
//!
//! Groups never share files: a member cannot learn from what uploads that another group holds a file.
//! Nothing is visible before it is whole: a file is written aside and renamed in once its digest matched, a
//! manifest once every file it names is there. Collection removes manifests unused for a while that no
//! live task names, then files no manifest names that are older than an upload takes.

use crate::manifest::{Kind, Manifest, hex, is_digest, is_id};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// A file younger than this is never collected (it may belong to an upload still under way).
pub const UPLOAD_GRACE: Duration = Duration::from_secs(3600);

/// One working directory, for listings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Info {
    pub id: String,
    pub project_group: String,
    /// Entries of every kind.
    pub entries: u64,
    pub files: u64,
    /// Bytes of its files.
    pub bytes: u64,
    pub created_ms: u64,
    pub last_used_ms: u64,
}

/// What a collection removed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Collected {
    pub workdirs: Vec<String>,
    pub files: u64,
    pub freed_bytes: u64,
}

/// The working directories under one directory.
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

fn ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn unhex(s: &str) -> Option<String> {
    if s.len() % 2 != 0 {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

/// A name for a file being written, unique in this process and among processes.
fn tmp_name() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    // Servers in containers sharing one directory may all be pid 1: each process also has a random word.
    static WORD: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let word = WORD.get_or_init(|| {
        use std::hash::{BuildHasher, Hasher};
        std::collections::hash_map::RandomState::new().build_hasher().finish()
    });
    format!(
        "{}.{word:016x}.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        ms(SystemTime::now())
    )
}

impl Store {
    pub fn new(root: impl Into<PathBuf>) -> Store {
        Store { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn group_dir(&self, group: &str) -> PathBuf {
        self.root.join(hex(group.as_bytes()))
    }

    fn blob(&self, group: &str, digest: &str) -> PathBuf {
        self.group_dir(group).join("blobs").join(&digest[..2]).join(digest)
    }

    fn tree(&self, group: &str, id: &str) -> PathBuf {
        self.group_dir(group).join("trees").join(format!("{id}.json"))
    }

    fn tmp(&self, group: &str) -> Result<PathBuf, String> {
        let dir = self.group_dir(group).join("tmp");
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(dir.join(tmp_name()))
    }

    /// The digests of `manifest`'s files that the group does not hold yet, each once, with their sizes.
    pub fn missing(&self, group: &str, manifest: &Manifest) -> Vec<(String, u64)> {
        manifest
            .blobs()
            .into_iter()
            .filter(|(d, _)| is_digest(d) && !self.blob(group, d).is_file())
            .map(|(d, s)| (d.to_owned(), s))
            .collect()
    }

    /// Bytes of the files the group holds.
    pub fn usage(&self, group: &str) -> u64 {
        let blobs = self.group_dir(group).join("blobs");
        let mut total = 0u64;
        for sub in std::fs::read_dir(&blobs).into_iter().flatten().flatten() {
            for f in std::fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                total = total.saturating_add(f.metadata().map_or(0, |m| m.len()));
            }
        }
        total
    }

    /// Takes in a tar stream of files named by their digests: each is written aside and hashed; once the
    /// stream ended well, all are made durable with one `syncfs` and renamed in (each only if its content is
    /// its name), and the renames made durable the same way. `max_each`: most bytes one file may have. Ok: how
    /// many files and bytes came in. A file whose content is not its name, or anything that is not such a
    /// file, refuses the whole stream: nothing of it is kept.
    pub fn put_blobs(&self, group: &str, stream: impl Read, max_each: u64) -> Result<(u64, u64), String> {
        let mut aside: Vec<(PathBuf, PathBuf)> = Vec::new();
        let taken = self.take_aside(group, stream, max_each, &mut aside);
        let kept = taken.and_then(|(n, bytes)| {
            let Some((first, _)) = aside.first() else { return Ok((n, bytes)) };
            let sync = |p: &Path| -> Result<(), String> {
                let f = std::fs::File::open(p).map_err(|e| format!("cannot open {}: {e}", p.display()))?;
                rustix::fs::syncfs(&f).map_err(|e| format!("cannot sync {}: {e}", p.display()))
            };
            sync(first)?;
            for (tmp, dst) in &aside {
                let parent = dst.parent().unwrap_or(&self.root);
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
                std::fs::rename(tmp, dst).map_err(|e| format!("cannot keep {}: {e}", dst.display()))?;
            }
            sync(&self.group_dir(group))?;
            Ok((n, bytes))
        });
        for (tmp, _) in &aside {
            let _ = std::fs::remove_file(tmp);
        }
        kept
    }

    /// Writes each file of `stream` aside (checked against its name), listing (aside, final path) in `aside`.
    fn take_aside(
        &self,
        group: &str,
        stream: impl Read,
        max_each: u64,
        aside: &mut Vec<(PathBuf, PathBuf)>,
    ) -> Result<(u64, u64), String> {
        let mut archive = tar::Archive::new(stream);
        let (mut n, mut bytes) = (0u64, 0u64);
        let entries = archive.entries().map_err(|e| format!("not a tar stream: {e}"))?;
        let mut seen = BTreeSet::new();
        for entry in entries {
            let mut entry = entry.map_err(|e| format!("not a tar stream: {e}"))?;
            let name = entry.path().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
            if !is_digest(&name) {
                return Err(format!("entry {name:?}: entries are named by their content's SHA-256"));
            }
            if entry.header().entry_type() != tar::EntryType::Regular {
                return Err(format!("entry {name}: only regular files are taken"));
            }
            let size = entry.size();
            if size > max_each {
                return Err(format!(
                    "entry {name}: {} over the {} an upload may hold",
                    crate::manifest::human(size),
                    crate::manifest::human(max_each)
                ));
            }
            let dst = self.blob(group, &name);
            if dst.is_file() || !seen.insert(name.clone()) {
                std::io::copy(&mut entry, &mut std::io::sink()).map_err(|e| e.to_string())?;
                continue;
            }
            let tmp = self.tmp(group)?;
            aside.push((tmp.clone(), dst));
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)
                .map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
            let mut h = Sha256::new();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let k = entry.read(&mut buf).map_err(|e| format!("the stream broke off: {e}"))?;
                if k == 0 {
                    break;
                }
                h.update(&buf[..k]);
                f.write_all(&buf[..k]).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
            }
            if hex(&h.finalize()) != name {
                return Err(format!(
                    "entry {name}: its content's SHA-256 is another; nothing of the stream was kept"
                ));
            }
            n += 1;
            bytes += size;
        }
        Ok((n, bytes))
    }

    /// Keeps `manifest` (already [`Manifest::check`]ed) for the group: Err lists the digests it names that
    /// the group does not hold. Committing one the group has is its use.
    pub fn commit(&self, group: &str, manifest: Manifest) -> Result<Info, Vec<String>> {
        let manifest = manifest.canonical();
        let missing: Vec<String> = self.missing(group, &manifest).into_iter().map(|(d, _)| d).collect();
        if !missing.is_empty() {
            return Err(missing);
        }
        let id = manifest.id();
        let path = self.tree(group, &id);
        if !path.is_file() {
            let write = || -> Result<(), String> {
                let tmp = self.tmp(group)?;
                let bytes = serde_json::to_vec(&manifest).map_err(|e| e.to_string())?;
                std::fs::write(&tmp, bytes).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
                let parent = path.parent().unwrap_or(&self.root);
                std::fs::create_dir_all(parent)
                    .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
                std::fs::rename(&tmp, &path).map_err(|e| format!("cannot keep {}: {e}", path.display()))
            };
            write().map_err(|e| vec![e])?;
        }
        self.touch(group, &id);
        self.info(group, &id).ok_or_else(|| vec![format!("{id} went while it was kept")])
    }

    /// The group's working directory `id`.
    pub fn manifest(&self, group: &str, id: &str) -> Option<Manifest> {
        if !is_id(id) {
            return None;
        }
        let bytes = std::fs::read(self.tree(group, id)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    pub fn info(&self, group: &str, id: &str) -> Option<Info> {
        let m = self.manifest(group, id)?;
        let meta = std::fs::metadata(self.tree(group, id)).ok()?;
        Some(Info {
            id: id.to_owned(),
            project_group: group.to_owned(),
            entries: m.entries.len() as u64,
            files: m.entries.iter().filter(|e| e.kind == Kind::File).count() as u64,
            bytes: m.bytes(),
            created_ms: meta.created().map_or(0, ms),
            last_used_ms: meta.modified().map_or(0, ms),
        })
    }

    /// Marks a use (a submit naming it): collection counts from the last. False: the group has no such
    /// working directory.
    pub fn touch(&self, group: &str, id: &str) -> bool {
        if !is_id(id) {
            return false;
        }
        std::fs::File::options()
            .write(true)
            .open(self.tree(group, id))
            .and_then(|f| f.set_modified(SystemTime::now()))
            .is_ok()
    }

    /// The groups that hold anything.
    pub fn groups(&self) -> Vec<String> {
        let mut groups: Vec<String> = std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| unhex(&e.file_name().to_string_lossy()))
            .collect();
        groups.sort();
        groups
    }

    /// The group's working directories, the last used first.
    pub fn list(&self, group: &str) -> Vec<Info> {
        let trees = self.group_dir(group).join("trees");
        let mut all: Vec<Info> = std::fs::read_dir(trees)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                self.info(group, name.strip_suffix(".json")?)
            })
            .collect();
        all.sort_by(|a, b| b.last_used_ms.cmp(&a.last_used_ms).then_with(|| a.id.cmp(&b.id)));
        all
    }

    /// Removes the working directories unused for `unused_for` that `live` does not name (as (group, id)),
    /// then the files no working directory left names and older than [`UPLOAD_GRACE`], and what an upload
    /// broken off left aside.
    pub fn collect(&self, live: &BTreeSet<(String, String)>, unused_for: Duration) -> Collected {
        let now = SystemTime::now();
        let old = |p: &Path, age: Duration| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .is_ok_and(|t| now.duration_since(t).is_ok_and(|d| d >= age))
        };
        let mut done = Collected::default();
        for group in self.groups() {
            let mut named: BTreeSet<String> = BTreeSet::new();
            for info in self.list(&group) {
                let path = self.tree(&group, &info.id);
                if !live.contains(&(group.clone(), info.id.clone())) && old(&path, unused_for) {
                    if std::fs::remove_file(&path).is_ok() {
                        done.workdirs.push(info.id);
                    }
                    continue;
                }
                if let Some(m) = self.manifest(&group, &info.id) {
                    named.extend(m.blobs().keys().map(|d| (*d).to_owned()));
                }
            }
            let gdir = self.group_dir(&group);
            for sub in std::fs::read_dir(gdir.join("blobs")).into_iter().flatten().flatten() {
                for f in std::fs::read_dir(sub.path()).into_iter().flatten().flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    if named.contains(&name) || !old(&f.path(), UPLOAD_GRACE) {
                        continue;
                    }
                    let size = f.metadata().map_or(0, |m| m.len());
                    if std::fs::remove_file(f.path()).is_ok() {
                        done.files += 1;
                        done.freed_bytes += size;
                    }
                }
            }
            for f in std::fs::read_dir(gdir.join("tmp")).into_iter().flatten().flatten() {
                if old(&f.path(), UPLOAD_GRACE) {
                    let _ = std::fs::remove_file(f.path());
                }
            }
        }
        done
    }

    /// Gives group `to` the working directory `id` of group `from` (a task cloned into another group takes
    /// its working directory along): the files `to` lacks are linked (copied across file systems), written
    /// aside and renamed in, then the manifest is kept for `to`. Refused when they would take `to` over
    /// `group_max` bytes. Ok: the working directory as `to` now holds it.
    pub fn copy_to(&self, from: &str, to: &str, id: &str, group_max: u64) -> Result<Info, String> {
        let m = self
            .manifest(from, id)
            .ok_or_else(|| format!("project group {from} has no working directory {id} (collected?)"))?;
        let missing = self.missing(to, &m);
        let adds: u64 = missing.iter().map(|(_, n)| n).sum();
        let usage = self.usage(to);
        if usage.saturating_add(adds) > group_max {
            return Err(format!(
                "project group {to} holds {} of working directories; this one's {} more would take it over the {} \
                 a group may hold (an admin setting, workdirGroupBytes)",
                crate::manifest::human(usage),
                crate::manifest::human(adds),
                crate::manifest::human(group_max)
            ));
        }
        for (digest, _) in &missing {
            let (src, dst) = (self.blob(from, digest), self.blob(to, digest));
            let tmp = self.tmp(to)?;
            if std::fs::hard_link(&src, &tmp).is_err() {
                std::fs::copy(&src, &tmp).map_err(|e| format!("cannot copy {digest}: {e}"))?;
            }
            let dir = dst.parent().expect("a blob has a parent");
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            std::fs::rename(&tmp, &dst).map_err(|e| format!("cannot keep {digest}: {e}"))?;
        }
        self.commit(to, m).map_err(|gone| format!("{} of its files went while it was copied", gone.len()))
    }

    /// Writes the files of the group's working directory `id` to `out` as a tar stream, each content once,
    /// named by its SHA-256 (what [`Store::put_blobs`] takes in: a fetch checks each against its name).
    /// Ok: the files' bytes.
    pub fn write_files(&self, group: &str, id: &str, out: impl Write) -> Result<u64, String> {
        let m = self
            .manifest(group, id)
            .ok_or_else(|| format!("project group {group} has no working directory {id} (collected?)"))?;
        let mut b = tar::Builder::new(out);
        let mut sent = 0u64;
        for (digest, size) in m.blobs() {
            let f = std::fs::File::open(self.blob(group, digest))
                .map_err(|e| format!("its content {digest} is gone: {e}"))?;
            let mut h = tar::Header::new_gnu();
            h.set_size(size);
            h.set_mode(0o600);
            h.set_entry_type(tar::EntryType::Regular);
            // The file's own length bounds what is read: a blob is never rewritten, but the header must not lie.
            b.append_data(&mut h, digest, f.take(size)).map_err(|e| format!("cannot send {digest}: {e}"))?;
            sent += size;
        }
        b.into_inner().and_then(|mut w| w.flush()).map_err(|e| format!("cannot end the stream: {e}"))?;
        Ok(sent)
    }

    /// Makes the group's working directory `id` at `dst` (which must not exist): dirs, files and links, all
    /// owned by `owner` (uid, gid); files 0644 or 0755, dirs 0755. Links are made last, and every path was
    /// checked to be plain, so nothing is ever written through a link. Ok: bytes written.
    pub fn materialize(
        &self,
        group: &str,
        id: &str,
        dst: &Path,
        owner: Option<(u32, u32)>,
    ) -> Result<u64, String> {
        let m = self
            .manifest(group, id)
            .ok_or_else(|| format!("project group {group} has no working directory {id} (collected?)"))?;
        if let Some((at, what)) = m.check(u64::MAX).into_iter().next() {
            return Err(format!("working directory {id} is not one the server would keep: {at}: {what}"));
        }
        let own = |p: &Path| -> Result<(), String> {
            if let Some((uid, gid)) = owner {
                rustix::fs::chownat(
                    rustix::fs::CWD,
                    p,
                    Some(rustix::fs::Uid::from_raw(uid)),
                    Some(rustix::fs::Gid::from_raw(gid)),
                    rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
                )
                .map_err(|e| format!("cannot own {}: {e}", p.display()))?;
            }
            Ok(())
        };
        let mkdir = |p: &Path| -> Result<(), String> { if make_dir(p)? { own(p) } else { Ok(()) } };
        mkdir(dst)?;
        let mut written = 0u64;
        let mut entries = m.entries.clone();
        entries.sort_by(|a, b| {
            (a.kind == Kind::Link).cmp(&(b.kind == Kind::Link)).then_with(|| a.path.cmp(&b.path))
        });
        for e in &entries {
            let at = dst.join(&e.path);
            // Parents the manifest leaves implicit.
            let mut parent = dst.to_owned();
            let parts: Vec<&str> = e.path.split('/').collect();
            for p in &parts[..parts.len() - 1] {
                parent.push(p);
                mkdir(&parent)?;
            }
            match e.kind {
                Kind::Dir => mkdir(&at)?,
                Kind::File => {
                    let digest = e.sha256.as_deref().unwrap_or_default();
                    let mut src = std::fs::File::open(self.blob(group, digest))
                        .map_err(|err| format!("{}: its content {digest} is gone: {err}", e.path))?;
                    let mut f = new_file(&at, e.executable)?;
                    written += std::io::copy(&mut src, &mut f)
                        .map_err(|err| format!("cannot write {}: {err}", at.display()))?;
                    own(&at)?;
                }
                Kind::Link => {
                    std::os::unix::fs::symlink(e.target.as_deref().unwrap_or_default(), &at)
                        .map_err(|err| format!("cannot link {}: {err}", at.display()))?;
                    own(&at)?;
                }
            }
        }
        Ok(written)
    }
}

/// A directory of a tree being made (0755); an existing one (not a link) is fine. Ok: whether it was made.
fn make_dir(p: &Path) -> Result<bool, String> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o755).create(p) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && !p.is_symlink() && p.is_dir() => Ok(false),
        Err(e) => Err(format!("cannot create {}: {e}", p.display())),
    }
}

/// A new file of a tree being made (0644, or 0755 when executable), never through a link or over anything.
fn new_file(p: &Path, executable: bool) -> Result<std::fs::File, String> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
        .mode(if executable { 0o755 } else { 0o644 })
        .open(p)
        .map_err(|err| format!("cannot create {}: {err}", p.display()))
}

/// A fetched working directory made at `dst` (an empty directory, or none): `manifest` and its files as
/// [`Store::write_files`] sends them. The manifest is checked against `id` and its rules first; the tree is
/// made in a directory of its own inside `dst`, each file written once at its first path as it streams in
/// (its digest checked as it is written; another path of the same content is a copy of it), links last, so
/// that nothing is written through a link; then moved into `dst`. Ok: the files' bytes. Err: what was
/// wrong, and nothing of it is left in `dst`.
pub fn unpack(manifest: Manifest, id: &str, files: impl Read, dst: &Path) -> Result<u64, String> {
    if manifest.clone().canonical().id() != id {
        return Err(format!("the manifest sent is not working directory {id}'s"));
    }
    if let Some((at, what)) = manifest.check(u64::MAX).into_iter().next() {
        return Err(format!("working directory {id} is not one the server would keep: {at}: {what}"));
    }
    std::fs::create_dir_all(dst).map_err(|e| format!("cannot create {}: {e}", dst.display()))?;
    let stage = dst.join(format!(".trainyard-fetch-{}", tmp_name()));
    let made = make_tree(&manifest, files, &stage);
    let moved = made.and_then(|bytes| {
        for e in std::fs::read_dir(&stage).map_err(|e| e.to_string())? {
            let e = e.map_err(|e| e.to_string())?;
            std::fs::rename(e.path(), dst.join(e.file_name())).map_err(|err| {
                format!("cannot move {} into place: {err}", e.file_name().to_string_lossy())
            })?;
        }
        Ok(bytes)
    });
    let _ = std::fs::remove_dir_all(&stage);
    if moved.is_err() {
        for e in manifest.entries.iter().filter(|e| !e.path.contains('/')) {
            let at = dst.join(&e.path);
            let _ = if at.is_dir() && !at.is_symlink() {
                std::fs::remove_dir_all(at)
            } else {
                std::fs::remove_file(at)
            };
        }
    }
    moved
}

/// The tree of a checked `manifest` at `at` (made here), its files from the tar stream `files`.
fn make_tree(manifest: &Manifest, files: impl Read, at: &Path) -> Result<u64, String> {
    let mkdir = |p: &Path| make_dir(p).map(|_| ());
    mkdir(at)?;
    // Directories first (every path was checked plain: none leads out, none is a link yet).
    for e in &manifest.entries {
        let parts: Vec<&str> = e.path.split('/').collect();
        let upto = if e.kind == Kind::Dir { parts.len() } else { parts.len() - 1 };
        let mut d = at.to_owned();
        for p in &parts[..upto] {
            d.push(p);
            mkdir(&d)?;
        }
    }
    // Each content's paths; the first is written from the stream, the others copied from it.
    let mut paths: std::collections::BTreeMap<&str, Vec<&crate::manifest::Entry>> = Default::default();
    for e in manifest.entries.iter().filter(|e| e.kind == Kind::File) {
        paths.entry(e.sha256.as_deref().unwrap_or_default()).or_default().push(e);
    }
    let create = |e: &crate::manifest::Entry| new_file(&at.join(&e.path), e.executable);
    let mut written = 0u64;
    let mut arrived = std::collections::BTreeSet::new();
    let mut archive = tar::Archive::new(files);
    for entry in archive.entries().map_err(|e| format!("the stream is not a tar: {e}"))? {
        let mut entry = entry.map_err(|e| format!("the stream broke off: {e}"))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err("the stream holds something other than regular files".into());
        }
        let name = entry.path().map_err(|e| e.to_string())?.to_string_lossy().into_owned();
        let Some(targets) = paths.get(name.as_str()).filter(|_| arrived.insert(name.clone())) else {
            return Err(format!("the stream has a file the manifest does not name, or twice: {name:?}"));
        };
        let first = targets[0];
        let mut f = create(first)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0u64;
        loop {
            let k = entry.read(&mut buf).map_err(|e| format!("the stream broke off in {name}: {e}"))?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
            f.write_all(&buf[..k]).map_err(|e| format!("cannot write {}: {e}", first.path))?;
            n += k as u64;
        }
        if crate::manifest::hex(&h.finalize()) != name || n != first.size {
            return Err(format!("{}: its content's SHA-256 is another than its name says", first.path));
        }
        written += n;
        for other in &targets[1..] {
            let mut to = create(other)?;
            let mut from = std::fs::File::open(at.join(&first.path)).map_err(|e| e.to_string())?;
            written +=
                std::io::copy(&mut from, &mut to).map_err(|e| format!("cannot write {}: {e}", other.path))?;
        }
    }
    if let Some(missing) = paths.keys().find(|d| !arrived.contains(**d)) {
        return Err(format!(
            "the stream ended without {} of its files (first: {missing})",
            paths.len() - arrived.len()
        ));
    }
    for e in manifest.entries.iter().filter(|e| e.kind == Kind::Link) {
        std::os::unix::fs::symlink(e.target.as_deref().unwrap_or_default(), at.join(&e.path))
            .map_err(|err| format!("cannot link {}: {err}", e.path))?;
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pack::{batches, pack};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ty-wdstore-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn an_upload_round_trips_and_a_second_sends_nothing() {
        let (src, root, out) = (dir("src"), dir("root"), dir("out"));
        std::fs::create_dir_all(src.join("pkg")).unwrap();
        std::fs::write(src.join("pkg/a.py"), "A = 1\n").unwrap();
        std::fs::write(src.join("pkg/b.py"), "A = 1\n").unwrap();
        std::fs::create_dir_all(src.join("empty")).unwrap();
        std::os::unix::fs::symlink("pkg/a.py", src.join("a.py")).unwrap();
        let p = pack(&src, 1 << 20).unwrap();
        let s = Store::new(&root);
        let missing: Vec<String> = s.missing("g", &p.manifest).into_iter().map(|(d, _)| d).collect();
        assert_eq!(missing.len(), 1, "two files of one content are one blob");
        assert_eq!(s.commit("g", p.manifest.clone()).unwrap_err(), missing);
        for b in batches(&p, &missing, 1 << 20) {
            let (tar, _) = b.unwrap();
            assert_eq!(s.put_blobs("g", tar.as_slice(), 1 << 20).unwrap(), (1, 6));
        }
        let info = s.commit("g", p.manifest.clone()).unwrap();
        assert_eq!((info.files, info.bytes), (2, 12));
        assert!(s.missing("g", &p.manifest).is_empty());
        assert_eq!(s.missing("other", &p.manifest).len(), 1, "groups share nothing");
        s.materialize("g", &info.id, &out, None).unwrap();
        assert_eq!(std::fs::read_to_string(out.join("a.py")).unwrap(), "A = 1\n");
        assert!(out.join("a.py").is_symlink() && out.join("empty").is_dir());
        assert_eq!(s.list("g").len(), 1);
        assert_eq!(s.groups(), ["g"]);
        // Nothing unused long enough: nothing goes; everything unused: the tree goes, its files wait for the
        // grace.
        assert!(s.collect(&BTreeSet::new(), Duration::from_secs(60)).workdirs.is_empty());
        let live = BTreeSet::from([("g".to_owned(), info.id.clone())]);
        assert!(s.collect(&live, Duration::ZERO).workdirs.is_empty());
        assert_eq!(s.collect(&BTreeSet::new(), Duration::ZERO).workdirs, vec![info.id.clone()]);
        for d in [src, root, out] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn a_fetch_makes_the_same_tree_and_refuses_a_stream_that_lies() {
        let (src, root, out) = (dir("fsrc"), dir("froot"), dir("fout"));
        std::fs::create_dir_all(src.join("pkg")).unwrap();
        std::fs::write(src.join("pkg/__init__.py"), "X = 2\n").unwrap();
        std::fs::write(src.join("run.sh"), "echo hi\n").unwrap();
        std::fs::set_permissions(src.join("run.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::os::unix::fs::symlink("pkg/__init__.py", src.join("init.py")).unwrap();
        let p = pack(&src, 1 << 20).unwrap();
        let s = Store::new(&root);
        let all: Vec<String> = s.missing("g", &p.manifest).into_iter().map(|(d, _)| d).collect();
        for b in batches(&p, &all, 1 << 20) {
            s.put_blobs("g", b.unwrap().0.as_slice(), 1 << 20).unwrap();
        }
        let info = s.commit("g", p.manifest.clone()).unwrap();
        let mut stream = Vec::new();
        assert_eq!(s.write_files("g", &info.id, &mut stream).unwrap(), 14);
        std::fs::create_dir_all(&out).unwrap();
        assert_eq!(unpack(p.manifest.clone(), &info.id, stream.as_slice(), &out).unwrap(), 14);
        assert_eq!(std::fs::read_to_string(out.join("init.py")).unwrap(), "X = 2\n");
        let mode =
            std::os::unix::fs::PermissionsExt::mode(&out.join("run.sh").metadata().unwrap().permissions());
        assert_eq!(mode & 0o777, 0o755);
        let names: Vec<String> =
            std::fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        assert!(!names.iter().any(|n| n.starts_with(".trainyard-fetch")), "the stage goes: {names:?}");
        // Another manifest under this id, a stream short of a file, a file whose content is another's.
        let other = dir("fother");
        let mut m = p.manifest.clone();
        m.entries.retain(|e| e.path != "run.sh");
        assert!(
            unpack(m, &info.id, stream.as_slice(), &other).unwrap_err().contains("not working directory")
        );
        let err = unpack(p.manifest.clone(), &info.id, &stream[..512], &other).unwrap_err();
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0, "nothing made from a broken stream: {err}");
        let lie = String::from_utf8_lossy(&stream).replace("X = 2", "X = 3");
        let err = unpack(p.manifest.clone(), &info.id, lie.as_bytes(), &other).unwrap_err();
        assert!(err.contains("SHA-256"), "{err}");
        assert_eq!(std::fs::read_dir(&other).unwrap().count(), 0);
        for d in [src, root, out, other] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn a_file_whose_content_is_not_its_name_is_not_kept() {
        let root = dir("liar");
        let s = Store::new(&root);
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, "a".repeat(64), &b"evil"[..]).unwrap();
        let tar = b.into_inner().unwrap();
        let err = s.put_blobs("g", tar.as_slice(), 100).unwrap_err();
        assert!(err.contains("its content's SHA-256 is another"), "{err}");
        assert_eq!(s.usage("g"), 0);
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(0);
        h.set_entry_type(tar::EntryType::Symlink);
        b.append_link(&mut h, "b".repeat(64), "/etc/shadow").unwrap();
        let err = s.put_blobs("g", b.into_inner().unwrap().as_slice(), 100).unwrap_err();
        assert!(err.contains("only regular files"), "{err}");
        let _ = std::fs::remove_dir_all(root);
    }
}
