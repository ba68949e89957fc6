//! Applying a layer (a tar stream, plain or gzip) onto a root file system being built, the way the OCI image
//! spec describes changesets:
//!
//! - `.wh.NAME` removes `NAME` from the layers below; `.wh..wh..opq` empties its directory of what the layers
//!   below put there (entries of this layer stay).
//! - Hard links point at a path of this root (this layer or one below), symlinks are written as they are and
//!   never followed out of the root: every path is resolved inside it as if the root were `/`, `..` stops at
//!   the root and an absolute link target starts again from the root.
//! - Regular files, directories, symlinks, hard links and FIFOs are made; device nodes are skipped (a sandbox
//!   has its own `/dev`). Set-user-ID and set-group-ID bits are dropped.
//! - Ownership: a sandbox maps one user, so every file is the server's, with its mode. A file the image gives
//!   to a user or group other than root also gets that user's (or group's) read and execute bits for
//!   everyone: the replica may run as that user (`User` in the image's config), and the root file system is
//!   read-only for every replica anyway.
//! - Modification times are kept (Python's bytecode caches compare them).

use std::collections::{HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

/// What one layer added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Bytes of regular files written.
    pub bytes: u64,
    pub entries: u64,
}

/// How deep symlinks may nest while a path is resolved.
const MAX_LINK_HOPS: u32 = 40;

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// Applies a layer read from `raw` (gzip or plain tar, told apart by their first bytes) onto `root`, a root
/// file system of any origin (every path is resolved on disk).
pub fn apply_layer(root: &Path, raw: impl Read + Send) -> Result<Applied, String> {
    Unpacker { root: root.to_path_buf(), links: None }.apply(raw)
}

/// Applies the layers of one image, in order, onto a root it builds from empty. It knows every symlink the
/// root holds (it made them), so a path none of whose parents is one of them resolves without asking the
/// disk, and only the others are walked link by link.
#[derive(Debug)]
pub struct Unpacker {
    root: PathBuf,
    /// Paths (relative to the root) that are or were symlinks; None: not known, resolve on disk always.
    links: Option<HashSet<PathBuf>>,
}

impl Unpacker {
    /// For an empty `root`.
    pub fn new(root: &Path) -> Unpacker {
        Unpacker { root: root.to_path_buf(), links: Some(HashSet::new()) }
    }

    /// Applies one layer (gzip or plain tar). A gzip layer is inflated on a thread of its own while this one
    /// writes the files (each takes about half the time; on two cores the two overlap).
    pub fn apply(&mut self, raw: impl Read + Send) -> Result<Applied, String> {
        let mut buf = BufReader::with_capacity(1 << 20, raw);
        let head = buf.fill_buf().map_err(|e| format!("cannot read the layer: {e}"))?;
        if head.starts_with(&[0x1f, 0x8b]) {
            std::thread::scope(|scope| {
                let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(8);
                scope.spawn(move || {
                    let mut gz = flate2::bufread::MultiGzDecoder::new(buf);
                    loop {
                        let mut chunk = vec![0u8; 1 << 20];
                        let mut n = 0;
                        // Whole chunks (the decoder hands out a little at a time).
                        while n < chunk.len() {
                            match gz.read(&mut chunk[n..]) {
                                Ok(0) => break,
                                Ok(k) => n += k,
                                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                                Err(e) => {
                                    let _ = tx.send(Err(e));
                                    return;
                                }
                            }
                        }
                        chunk.truncate(n);
                        let done = n == 0;
                        // The reader went away (the layer failed): stop.
                        if tx.send(Ok(chunk)).is_err() || done {
                            return;
                        }
                    }
                });
                self.apply_tar(Chunks { rx, cur: Vec::new(), at: 0 })
            })
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Err("the layer is zstd-compressed, which this machine does not unpack yet (push it with gzip)"
                .into())
        } else {
            self.apply_tar(buf)
        }
    }

    /// `rel` resolved inside the root: directly when no prefix of it is a known symlink, else on disk.
    fn resolve(&self, rel: &Path, follow_last: bool) -> Result<PathBuf, String> {
        if let Some(links) = &self.links {
            let mut through_link = false;
            let mut prefix = PathBuf::new();
            let mut n = rel.components().count();
            for c in rel.components() {
                prefix.push(c);
                n -= 1;
                if (n > 0 || follow_last) && links.contains(&prefix) {
                    through_link = true;
                    break;
                }
            }
            if !through_link {
                return Ok(self.root.join(rel));
            }
        }
        resolve(&self.root, rel, follow_last)
    }

    fn link_made(&mut self, rel: &Path) {
        if let Some(links) = &mut self.links {
            links.insert(rel.to_path_buf());
        }
    }
}

impl Unpacker {
    fn apply_tar(&mut self, r: impl Read) -> Result<Applied, String> {
        let root = self.root.clone();
        let root = root.as_path();
        let mut archive = tar::Archive::new(r);
        let mut done = Applied::default();
        // Paths this layer wrote: an opaque whiteout keeps them.
        let mut ours: HashSet<PathBuf> = HashSet::new();
        let entries = archive.entries().map_err(|e| format!("the layer is not a tar archive: {e}"))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| format!("a damaged entry in the layer: {e}"))?;
            let path = entry.path().map_err(|e| format!("an entry's path: {e}"))?.into_owned();
            let rel = clean(&path);
            let Some(name) = rel.file_name().map(OsStr::to_owned) else { continue };
            let parent_rel = rel.parent().map(Path::to_path_buf).unwrap_or_default();
            let name_s = name.to_string_lossy();
            if name_s == OPAQUE {
                let dir = self.resolve(&parent_rel, true)?;
                empty_below(root, &dir, &parent_rel, &ours)?;
                continue;
            }
            if let Some(gone) = name_s.strip_prefix(WHITEOUT) {
                let dir = self.resolve(&parent_rel, true)?;
                remove_any(&dir.join(gone))?;
                continue;
            }
            let kind = entry.header().entry_type();
            if matches!(kind, tar::EntryType::XGlobalHeader | tar::EntryType::XHeader) {
                continue;
            }
            let parent = self.resolve(&parent_rel, true)?;
            make_dirs(root, &parent).map_err(|e| format!("cannot make {}: {e}", parent_rel.display()))?;
            let target = parent.join(&name);
            let header = entry.header();
            let raw_mode = header.mode().unwrap_or(0o644) & 0o7777;
            let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
            let mode = shared_mode(raw_mode, uid, gid);
            let mtime = header.mtime().unwrap_or(0);
            let at = || rel.display().to_string();
            match kind {
                tar::EntryType::Directory => {
                    match std::fs::symlink_metadata(&target) {
                        Ok(m) if m.is_dir() => {}
                        Ok(_) => {
                            remove_any(&target)?;
                            mkdir(&target, &at)?;
                        }
                        Err(_) => mkdir(&target, &at)?,
                    }
                    chmod(&target, mode, &at)?;
                }
                tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse => {
                    remove_any(&target)?;
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&target)
                        .map_err(|e| io_err(&at(), &e))?;
                    let n = std::io::copy(&mut entry, &mut f).map_err(|e| io_err(&at(), &e))?;
                    f.set_permissions(std::fs::Permissions::from_mode(mode))
                        .map_err(|e| io_err(&at(), &e))?;
                    set_mtime(&target, mtime);
                    done.bytes += n;
                }
                tar::EntryType::Symlink => {
                    let to = entry
                        .link_name()
                        .map_err(|e| format!("{}: {e}", at()))?
                        .ok_or_else(|| format!("{}: a symlink without a target", at()))?
                        .into_owned();
                    remove_any(&target)?;
                    std::os::unix::fs::symlink(&to, &target).map_err(|e| io_err(&at(), &e))?;
                    set_mtime(&target, mtime);
                    self.link_made(&rel);
                }
                tar::EntryType::Link => {
                    let to = entry
                        .link_name()
                        .map_err(|e| format!("{}: {e}", at()))?
                        .ok_or_else(|| format!("{}: a hard link without a target", at()))?
                        .into_owned();
                    let src = resolve(root, &clean(&to), false)?;
                    let m = std::fs::symlink_metadata(&src).map_err(|_| {
                        format!("{}: links to {}, which the layers do not have", at(), to.display())
                    })?;
                    if m.is_dir() {
                        return Err(format!("{}: a hard link to a directory", at()));
                    }
                    if src != target {
                        remove_any(&target)?;
                        std::fs::hard_link(&src, &target).map_err(|e| io_err(&at(), &e))?;
                    }
                }
                tar::EntryType::Fifo => {
                    remove_any(&target)?;
                    rustix::fs::mknodat(
                        rustix::fs::CWD,
                        &target,
                        rustix::fs::FileType::Fifo,
                        rustix::fs::Mode::from_raw_mode(mode),
                        0,
                    )
                    .map_err(|e| format!("{}: {e}", at()))?;
                    chmod(&target, mode, &at)?;
                }
                // Devices: the sandbox has its own /dev. Anything else is not a file system entry.
                _ => continue,
            }
            ours.insert(rel);
            done.entries += 1;
        }
        Ok(done)
    }
}

/// A layer's path as a relative path of normal components (`./a/../b` is `b`; nothing climbs above the
/// root).
fn clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(x) => out.push(x),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// The inflated bytes of a layer, as the inflating thread hands them over.
struct Chunks {
    rx: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    cur: Vec<u8>,
    at: usize,
}

impl Read for Chunks {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.cur.len() {
            match self.rx.recv() {
                Ok(Ok(c)) if c.is_empty() => return Ok(0),
                Ok(Ok(c)) => {
                    self.cur = c;
                    self.at = 0;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len() - self.at);
        out[..n].copy_from_slice(&self.cur[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// `rel` resolved inside `root` as if `root` were `/`: symlinks on the way (and the last component's, when
/// `follow_last`) are followed within the root. What does not exist yet is taken as it is.
pub fn resolve(root: &Path, rel: &Path, follow_last: bool) -> Result<PathBuf, String> {
    let mut todo: VecDeque<OsString> = VecDeque::new();
    for c in rel.components() {
        match c {
            Component::Normal(x) => todo.push_back(x.to_owned()),
            Component::ParentDir => todo.push_back("..".into()),
            _ => {}
        }
    }
    let mut cur = root.to_path_buf();
    let mut depth = 0usize;
    let mut hops = 0;
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            if depth > 0 {
                cur.pop();
                depth -= 1;
            }
            continue;
        }
        let next = cur.join(&c);
        let last = todo.is_empty();
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() && (!last || follow_last) => {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(format!("{}: too many levels of symlinks", rel.display()));
                }
                let to = std::fs::read_link(&next).map_err(|e| format!("{}: {e}", rel.display()))?;
                if to.is_absolute() {
                    cur = root.to_path_buf();
                    depth = 0;
                }
                for c in to.components().rev() {
                    match c {
                        Component::Normal(x) => todo.push_front(x.to_owned()),
                        Component::ParentDir => todo.push_front("..".into()),
                        _ => {}
                    }
                }
            }
            _ => {
                cur = next;
                depth += 1;
            }
        }
    }
    Ok(cur)
}

/// The mode a file gets in the shared root: no set-ID bits; an image user's or group's read and execute bits
/// given to everyone.
pub fn shared_mode(mode: u32, uid: u64, gid: u64) -> u32 {
    let mut m = mode & 0o1777;
    if uid != 0 {
        m |= (m >> 6) & 0o5;
    }
    if gid != 0 {
        m |= (m >> 3) & 0o5;
    }
    m
}

/// Makes `dir` (resolved, under `root`) and the dirs on the way to it that no layer named, mode 0755 (not the
/// server's private umask: replicas must pass through them).
fn make_dirs(root: &Path, dir: &Path) -> std::io::Result<()> {
    if dir.is_dir() || dir == root {
        return Ok(());
    }
    if let Some(parent) = dir.parent()
        && parent.starts_with(root)
    {
        make_dirs(root, parent)?;
    }
    std::fs::create_dir(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
}

/// Removes what the layers below put in `dir` (an opaque whiteout), keeping this layer's entries.
fn empty_below(root: &Path, dir: &Path, dir_rel: &Path, ours: &HashSet<PathBuf>) -> Result<(), String> {
    let _ = root;
    let Ok(rd) = std::fs::read_dir(dir) else { return Ok(()) };
    for e in rd.flatten() {
        let rel = dir_rel.join(e.file_name());
        if !ours.contains(&rel) {
            remove_any(&e.path())?;
        }
    }
    Ok(())
}

/// Removes a file, link or whole directory, if there.
fn remove_any(p: &Path) -> Result<(), String> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(_) => return Ok(()),
    }
    .map_err(|e| io_err(&p.display().to_string(), &e))
}

fn mkdir(p: &Path, at: &dyn Fn() -> String) -> Result<(), String> {
    std::fs::create_dir(p).map_err(|e| io_err(&at(), &e))
}

fn chmod(p: &Path, mode: u32, at: &dyn Fn() -> String) -> Result<(), String> {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).map_err(|e| io_err(&at(), &e))
}

fn set_mtime(p: &Path, secs: u64) {
    let t = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec { tv_sec: secs as i64, tv_nsec: 0 },
        last_modification: rustix::fs::Timespec { tv_sec: secs as i64, tv_nsec: 0 },
    };
    let _ = rustix::fs::utimensat(rustix::fs::CWD, p, &t, rustix::fs::AtFlags::SYMLINK_NOFOLLOW);
}

/// An I/O error while unpacking; "no space left" is said as such (the caller classes it disk-full).
fn io_err(at: &str, e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(28) {
        return format!("{NO_SPACE}: {at}");
    }
    format!("{at}: {e}")
}

/// How an unpack that ran out of space starts its message.
pub const NO_SPACE: &str = "no space left on the image cache's disk";

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
