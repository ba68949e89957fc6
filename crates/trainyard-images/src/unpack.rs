//! Applying a layer (a tar stream, plain or gzip) onto a root file system being built, the way the OCI image
//! spec describes changesets:
//!
//! - `.wh.NAME` removes `NAME` from the layers below; `.wh..wh..opq` empties its directory of what the layers
//!   below put there (entries of this layer stay).
//! - Hard links point at a path of this root (this layer or one below); symlinks are written as they are.
//! - Regular files, directories, symlinks, hard links and FIFOs are made; device nodes are skipped (a sandbox
//!   has its own `/dev`). Set-user-ID and set-group-ID bits are dropped.
//! - Ownership: a sandbox maps one user, so every file is the unpacker's, with its mode. A file the image gives
//!   to a user or group other than root also gets that user's (or group's) read and execute bits for
//!   everyone: the replica may run as that user (`User` in the image's config), and the root file system is
//!   read-only for every replica anyway. Directories keep their owner's read, write and search bits (the
//!   owner is the unpacker's uid, which no replica runs as), so a later entry can always be written in them.
//! - Modification times are kept (Python's bytecode caches compare them).
//!
//! **Every path is resolved on disk, inside the root** (this is the security boundary: a layer is what a
//! tenant pushed). Nothing here names a file by a host path: the root is opened once, and every create, open,
//! link and unlink is made relative to a directory handle reached from it by [`Root::dir`], a walk that opens
//! one component at a time without following it (`O_PATH | O_NOFOLLOW`), reads a symlink it meets and walks
//! its target from the root again when it is absolute, and never climbs above the root with `..`. So a
//! symlink made through another symlink, a hard link to a symlink, a whiteout under a link: each is whatever
//! the disk holds at that moment, resolved as if the root were `/`. The handles of directories walked are
//! kept for the next entries (tar streams list a directory's entries together), and all are dropped the
//! moment anything is removed or replaced, since a removal is the only way a path's meaning changes here
//! (nothing is renamed, and nothing else writes the tree while a layer is applied).
//!
//! A second line holds when the server is root: [`unprivileged`] runs the unpack on a thread of its own with
//! an unprivileged uid and gid and no capabilities, so a case the walk missed still could not write where
//! only root can.

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

/// What one layer added.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Bytes of regular files written.
    pub bytes: u64,
    pub entries: u64,
}

/// How much one layer, and one image (all its layers), may unpack to, and how much of the cache's disk must
/// stay free while it does. A layer past any of them stops at once with [`TOO_LARGE`] or [`NO_SPACE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of regular files one layer may hold.
    pub layer_bytes: u64,
    /// Entries (files, directories, links) one layer may hold.
    pub layer_entries: u64,
    /// Bytes of regular files one image may hold (every layer's, counted as written).
    pub image_bytes: u64,
    /// Entries one image may hold.
    pub image_entries: u64,
    /// Bytes the cache's file system keeps free: an unpack that would leave less stops.
    pub reserve_bytes: u64,
    /// Inodes the cache's file system keeps free.
    pub reserve_inodes: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            layer_bytes: 64 << 30,
            layer_entries: 1_000_000,
            image_bytes: 128 << 30,
            image_entries: 2_000_000,
            reserve_bytes: 256 << 20,
            reserve_inodes: 100_000,
        }
    }
}

impl Limits {
    /// No bounds but the disk's (for tests and tools that unpack what they made themselves).
    pub fn unbounded() -> Limits {
        Limits {
            layer_bytes: u64::MAX,
            layer_entries: u64::MAX,
            image_bytes: u64::MAX,
            image_entries: u64::MAX,
            reserve_bytes: 0,
            reserve_inodes: 0,
        }
    }
}

/// How deep symlinks may nest while a path is resolved.
const MAX_LINK_HOPS: u32 = 40;
/// How deep a directory may be (the kernel's `PATH_MAX` allows about this many one-letter names).
const MAX_DEPTH: usize = 2048;
/// Directory handles kept between entries.
const MAX_KEPT_DIRS: usize = 4096;
/// How often the cache's disk is asked how much room it has left: every this many bytes or entries.
const DISK_CHECK_BYTES: u64 = 64 << 20;
const DISK_CHECK_ENTRIES: u64 = 4096;

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

/// How an unpack that ran out of space starts its message.
pub const NO_SPACE: &str = "no space left on the image cache's disk";
/// How an unpack past one of its [`Limits`] starts its message.
pub const TOO_LARGE: &str = "the image is larger than this machine allows";

/// Applies a layer read from `raw` (gzip or plain tar, told apart by their first bytes) onto `root`, with no
/// bounds but the disk's.
pub fn apply_layer(root: &Path, raw: impl Read + Send) -> Result<Applied, String> {
    Unpacker::new(root, Limits::unbounded())?.apply(raw)
}

/// Applies the layers of one image, in order, onto a root.
#[derive(Debug)]
pub struct Unpacker {
    root: Root,
    limits: Limits,
    /// What the image holds so far.
    total: Applied,
    /// Bytes and entries since the disk was last asked for its room.
    since_check: Applied,
}

impl Unpacker {
    /// For the root file system at `root` (a directory that exists).
    pub fn new(root: &Path, limits: Limits) -> Result<Unpacker, String> {
        let fd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| format!("cannot open the root file system {}: {e}", root.display()))?;
        Ok(Unpacker::at(fd, limits))
    }

    /// For the root file system open as `fd` (any handle of a directory, `O_PATH` is enough).
    pub fn at(fd: OwnedFd, limits: Limits) -> Unpacker {
        Unpacker {
            root: Root { fd: Rc::new(fd), dirs: HashMap::new() },
            limits,
            total: Applied::default(),
            since_check: Applied::default(),
        }
    }

    /// What the layers applied so far hold.
    pub fn total(&self) -> Applied {
        self.total
    }

    /// Applies one layer (gzip or plain tar). A gzip layer is inflated on a thread of its own while this one
    /// writes the files (each takes about half the time; on two cores the two overlap).
    pub fn apply(&mut self, raw: impl Read + Send) -> Result<Applied, String> {
        let mut buf = BufReader::with_capacity(1 << 20, raw);
        let head = buf.fill_buf().map_err(|e| format!("cannot read the layer: {e}"))?;
        if head.starts_with(&[0x1f, 0x8b]) {
            std::thread::scope(|scope| {
                let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Vec<u8>>>(8);
                scope.spawn(move || inflate(buf, tx));
                self.apply_tar(Chunks { rx, cur: Vec::new(), at: 0 })
            })
        } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Err("the layer is zstd-compressed, which this machine does not unpack yet (push it with gzip)"
                .into())
        } else {
            self.apply_tar(buf)
        }
    }

    fn apply_tar(&mut self, r: impl Read) -> Result<Applied, String> {
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
            let at = || rel.display().to_string();
            let kind = entry.header().entry_type();
            if matches!(kind, tar::EntryType::XGlobalHeader | tar::EntryType::XHeader) {
                continue;
            }
            self.count(&mut done, 0, 1)?;
            let name_b = name.as_bytes();
            if name_b == OPAQUE.as_bytes() {
                if let Some(dir) = self.root.dir(&parent_rel, false).map_err(|e| e.at(&at()))? {
                    self.root.empty_below(dir.as_fd(), &parent_rel, &ours).map_err(|e| e.at(&at()))?;
                }
                continue;
            }
            if let Some(gone) = name_b.strip_prefix(WHITEOUT.as_bytes()) {
                let gone = OsStr::from_bytes(gone);
                if !gone.is_empty()
                    && gone != "."
                    && gone != ".."
                    && let Some(dir) = self.root.dir(&parent_rel, false).map_err(|e| e.at(&at()))?
                {
                    self.root.remove(dir.as_fd(), gone, 0).map_err(|e| e.at(&at()))?;
                }
                continue;
            }
            let header = entry.header();
            let raw_mode = header.mode().unwrap_or(0o644) & 0o7777;
            let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
            let mode = shared_mode(raw_mode, uid, gid);
            let mtime = header.mtime().unwrap_or(0);
            let size = header.size().unwrap_or(0);
            // A link's target, read from the header before the entry is written.
            let link = match kind {
                tar::EntryType::Symlink | tar::EntryType::Link => Some(
                    entry
                        .link_name()
                        .map_err(|e| format!("{}: {e}", at()))?
                        .ok_or_else(|| format!("{}: a link without a target", at()))?
                        .into_owned(),
                ),
                _ => None,
            };
            // Devices are skipped (the sandbox has its own /dev); anything else is not a file system entry.
            if !matches!(
                kind,
                tar::EntryType::Directory
                    | tar::EntryType::Regular
                    | tar::EntryType::Continuous
                    | tar::EntryType::GNUSparse
                    | tar::EntryType::Symlink
                    | tar::EntryType::Link
                    | tar::EntryType::Fifo
            ) {
                continue;
            }
            if matches!(
                kind,
                tar::EntryType::Regular | tar::EntryType::Continuous | tar::EntryType::GNUSparse
            ) {
                // The header's size, checked before a byte is written.
                self.fits(done.bytes.saturating_add(size), self.total.bytes.saturating_add(size))?;
            }
            let parent = self
                .root
                .dir(&parent_rel, true)
                .map_err(|e| e.at(&parent_rel.display().to_string()))?
                .ok_or_else(|| format!("{}: its directory cannot be made", at()))?;
            let parent = parent.as_fd();
            match kind {
                tar::EntryType::Directory => {
                    self.root.make_dir(parent, &name, mode).map_err(|e| e.at(&at()))?
                }
                tar::EntryType::Symlink => {
                    let to = link.unwrap_or_default();
                    self.root.remove(parent, &name, 0).map_err(|e| e.at(&at()))?;
                    rustix::fs::symlinkat(to.as_os_str(), parent, &name).map_err(|e| errno(&at(), e))?;
                    set_mtime(parent, &name, mtime);
                }
                tar::EntryType::Link => {
                    let to = clean(&link.unwrap_or_default());
                    self.hard_link(parent, &name, &to).map_err(|e| match e {
                        Walk::Missing => {
                            format!("{}: links to {}, which the layers do not have", at(), to.display())
                        }
                        e => e.at(&at()),
                    })?;
                }
                tar::EntryType::Fifo => {
                    self.root.remove(parent, &name, 0).map_err(|e| e.at(&at()))?;
                    rustix::fs::mknodat(parent, &name, FileType::Fifo, Mode::from_raw_mode(mode), 0)
                        .map_err(|e| errno(&at(), e))?;
                    rustix::fs::chmodat(parent, &name, Mode::from_raw_mode(mode), AtFlags::empty())
                        .map_err(|e| errno(&at(), e))?;
                }
                _ => {
                    self.root.remove(parent, &name, 0).map_err(|e| e.at(&at()))?;
                    let fd = rustix::fs::openat(
                        parent,
                        &name,
                        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::from_raw_mode(0o600),
                    )
                    .map_err(|e| errno(&at(), e))?;
                    let mut f = std::fs::File::from(fd);
                    let n = self.copy(&mut entry, &mut f, &done, &at)?;
                    rustix::fs::fchmod(&f, Mode::from_raw_mode(mode)).map_err(|e| errno(&at(), e))?;
                    let t = times(mtime);
                    let _ = rustix::fs::futimens(&f, &t);
                    self.count(&mut done, n, 0)?;
                }
            }
            ours.insert(rel);
        }
        Ok(done)
    }

    /// `name` in `parent` made a hard link to the root's `to` (which must exist and not be a directory; a
    /// symlink is linked as the symlink, never followed).
    fn hard_link(&mut self, parent: BorrowedFd, name: &OsStr, to: &Path) -> Result<(), Walk> {
        let to_name = to.file_name().ok_or(Walk::Os(rustix::io::Errno::ISDIR))?;
        let to_parent = self.root.dir(to.parent().unwrap_or(Path::new("")), false)?.ok_or(Walk::Missing)?;
        let src =
            rustix::fs::statat(&*to_parent, to_name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| match e {
                rustix::io::Errno::NOENT => Walk::Missing,
                e => Walk::Os(e),
            })?;
        if FileType::from_raw_mode(src.st_mode) == FileType::Directory {
            return Err(Walk::Text("a hard link to a directory".into()));
        }
        if let Ok(dst) = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
            && (dst.st_dev, dst.st_ino) == (src.st_dev, src.st_ino)
        {
            return Ok(());
        }
        self.root.remove(parent, name, 0)?;
        rustix::fs::linkat(&*to_parent, to_name, parent, name, AtFlags::empty()).map_err(|e| match e {
            rustix::io::Errno::NOENT => Walk::Missing,
            e => Walk::Os(e),
        })
    }

    /// Copies a file's bytes, stopping at the first byte past the limits and asking the disk for its room as
    /// it goes.
    fn copy(
        &mut self,
        from: &mut impl Read,
        to: &mut std::fs::File,
        done: &Applied,
        at: &dyn Fn() -> String,
    ) -> Result<u64, String> {
        let mut buf = [0u8; 64 << 10];
        let (mut n, mut checked) = (0u64, 0u64);
        loop {
            let k = match from.read(&mut buf) {
                Ok(0) => return Ok(n),
                Ok(k) => k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("{}: {e}", at())),
            };
            n += k as u64;
            self.fits(done.bytes.saturating_add(n), self.total.bytes.saturating_add(n))?;
            to.write_all(&buf[..k]).map_err(|e| io_err(&at(), &e))?;
            if n - checked >= DISK_CHECK_BYTES {
                self.room()?;
                checked = n;
            }
        }
    }

    /// Whether this layer may hold `layer_bytes` and the image `image_bytes` (both counting what is about to be
    /// written).
    fn fits(&self, layer_bytes: u64, image_bytes: u64) -> Result<(), String> {
        let l = &self.limits;
        if layer_bytes > l.layer_bytes {
            return Err(format!("{TOO_LARGE}: a layer unpacks to more than {} bytes", l.layer_bytes));
        }
        if image_bytes > l.image_bytes {
            return Err(format!("{TOO_LARGE}: the image unpacks to more than {} bytes", l.image_bytes));
        }
        Ok(())
    }

    /// Counts what an entry added (after the bytes were written, or as the entry starts).
    fn count(&mut self, done: &mut Applied, bytes: u64, entries: u64) -> Result<(), String> {
        done.bytes += bytes;
        done.entries += entries;
        self.total.bytes += bytes;
        self.total.entries += entries;
        self.since_check.bytes += bytes;
        self.since_check.entries += entries;
        let l = &self.limits;
        if done.entries > l.layer_entries {
            return Err(format!("{TOO_LARGE}: a layer holds more than {} entries", l.layer_entries));
        }
        if self.total.entries > l.image_entries {
            return Err(format!("{TOO_LARGE}: the image holds more than {} entries", l.image_entries));
        }
        if self.since_check.entries >= DISK_CHECK_ENTRIES || self.since_check.bytes >= DISK_CHECK_BYTES {
            self.room()?;
        }
        Ok(())
    }

    /// Stops when the cache's disk has less room than the limits keep free.
    fn room(&mut self) -> Result<(), String> {
        self.since_check = Applied::default();
        let l = self.limits;
        if l.reserve_bytes == 0 && l.reserve_inodes == 0 {
            return Ok(());
        }
        let Ok(s) = rustix::fs::fstatvfs(&*self.root.fd) else { return Ok(()) };
        let free = s.f_bavail.saturating_mul(s.f_frsize);
        if free < l.reserve_bytes {
            return Err(format!(
                "{NO_SPACE}: {free} bytes are left, less than the {} this machine keeps free",
                l.reserve_bytes
            ));
        }
        // A file system without an inode count (some report 0 files) is not judged by it.
        if s.f_files > 0 && s.f_favail < l.reserve_inodes {
            return Err(format!(
                "{NO_SPACE}: {} inodes are left, fewer than the {} this machine keeps free",
                s.f_favail, l.reserve_inodes
            ));
        }
        Ok(())
    }
}

/// Inflates a gzip layer into whole chunks for the writing thread.
fn inflate(buf: impl BufRead, tx: std::sync::mpsc::SyncSender<std::io::Result<Vec<u8>>>) {
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
}

/// Why a walk failed.
#[derive(Debug)]
enum Walk {
    /// A component is not there (and the walk was not asked to make it).
    Missing,
    /// A component on the way is a file, not a directory.
    NotDir,
    Loop,
    TooDeep,
    Os(rustix::io::Errno),
    Text(String),
}

impl Walk {
    fn at(self, at: &str) -> String {
        match self {
            Walk::Missing => format!("{at}: not found"),
            Walk::NotDir => format!("{at}: a path component is not a directory"),
            Walk::Loop => format!("{at}: too many levels of symlinks"),
            Walk::TooDeep => format!("{at}: directories nested deeper than {MAX_DEPTH}"),
            Walk::Os(e) => errno(at, e),
            Walk::Text(t) => format!("{at}: {t}"),
        }
    }
}

impl From<rustix::io::Errno> for Walk {
    fn from(e: rustix::io::Errno) -> Walk {
        Walk::Os(e)
    }
}

/// The root being built: its handle, and handles of directories walked to (valid until anything is removed).
#[derive(Debug)]
struct Root {
    fd: Rc<OwnedFd>,
    dirs: HashMap<PathBuf, Rc<OwnedFd>>,
}

impl Root {
    /// The directory `rel` (a layer's path, cleaned) resolves to inside the root, symlinks followed within
    /// it. Directories that are not there are made (mode 0755) when `make`, else the answer is None; a
    /// component that is a file is an error either way.
    fn dir(&mut self, rel: &Path, make: bool) -> Result<Option<Rc<OwnedFd>>, Walk> {
        if rel.as_os_str().is_empty() {
            return Ok(Some(self.fd.clone()));
        }
        if let Some(fd) = self.dirs.get(rel) {
            return Ok(Some(fd.clone()));
        }
        let want = if make { Want::MadeDir } else { Want::Dir };
        match walk(&self.fd, rel, want) {
            Ok(Found::Entry(..)) => Err(Walk::NotDir),
            Ok(Found::Dir(fd)) => {
                let fd = Rc::new(fd);
                if self.dirs.len() >= MAX_KEPT_DIRS {
                    self.dirs.clear();
                }
                self.dirs.insert(rel.to_path_buf(), fd.clone());
                Ok(Some(fd))
            }
            Err(Walk::Missing) if !make => Ok(None),
            Err(Walk::NotDir) if !make => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Makes `name` in `parent` a directory with `mode` (keeping one that is there, replacing anything
    /// else).
    fn make_dir(&mut self, parent: BorrowedFd, name: &OsStr, mode: u32) -> Result<(), Walk> {
        let mode = Mode::from_raw_mode(mode | 0o700);
        match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) if FileType::from_raw_mode(s.st_mode) == FileType::Directory => {}
            Ok(_) => {
                self.remove(parent, name, 0)?;
                rustix::fs::mkdirat(parent, name, mode)?;
            }
            Err(_) => rustix::fs::mkdirat(parent, name, mode)?,
        }
        // A directory (checked above, and nothing else writes here): chmod does not follow anything.
        rustix::fs::chmodat(parent, name, mode, AtFlags::empty())?;
        Ok(())
    }

    /// Removes `name` from `parent`, a whole directory included, never following a link; nothing when it is
    /// not there.
    fn remove(&mut self, parent: BorrowedFd, name: &OsStr, depth: usize) -> Result<(), Walk> {
        let s = match rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(s) => s,
            Err(rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(Walk::Os(e)),
        };
        // Any removal may change what a kept path leads to.
        self.dirs.clear();
        if FileType::from_raw_mode(s.st_mode) != FileType::Directory {
            rustix::fs::unlinkat(parent, name, AtFlags::empty())?;
            return Ok(());
        }
        if depth >= MAX_DEPTH {
            return Err(Walk::TooDeep);
        }
        let dir = rustix::fs::openat(
            parent,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        for child in names(&dir)? {
            self.remove(dir.as_fd(), &child, depth + 1)?;
        }
        rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?;
        Ok(())
    }

    /// Removes what the layers below put in `dir` (an opaque whiteout), keeping this layer's entries.
    fn empty_below(&mut self, dir: BorrowedFd, dir_rel: &Path, ours: &HashSet<PathBuf>) -> Result<(), Walk> {
        for name in names(dir)? {
            if !ours.contains(&dir_rel.join(&name)) {
                self.remove(dir, &name, 0)?;
            }
        }
        Ok(())
    }
}

/// The names in a directory (not `.` and `..`).
fn names(dir: impl AsFd) -> Result<Vec<OsString>, Walk> {
    let fd =
        rustix::fs::openat(dir, ".", OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    let mut d = rustix::fs::Dir::new(fd)?;
    let mut out = Vec::new();
    while let Some(e) = d.read() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_owned());
        }
    }
    Ok(out)
}

/// What a [`walk`] is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    /// A directory, made where missing.
    MadeDir,
    /// A directory that is there.
    Dir,
    /// The directory holding the last name, which is followed when it is a symlink.
    Entry,
}

/// What a [`walk`] reached.
enum Found {
    Dir(OwnedFd),
    /// A directory and a name in it (not a symlink; maybe not there).
    Entry(OwnedFd, OsString),
}

/// Walks `rel` from `root` one component at a time, never following anything out of the root: each
/// component is opened without following it; a symlink's target is walked in its place (from the root when
/// absolute); `..` goes back one directory and never above the root.
fn walk(root: &OwnedFd, rel: &Path, want: Want) -> Result<Found, Walk> {
    let mut todo: VecDeque<OsString> = VecDeque::new();
    push_front(&mut todo, rel);
    // The directories walked through, deepest last (the root is below them all).
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut hops = 0;
    let here = |stack: &mut Vec<OwnedFd>| -> Result<OwnedFd, Walk> {
        match stack.pop() {
            Some(fd) => Ok(fd),
            None => Ok(rustix::fs::openat(
                root,
                ".",
                OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )?),
        }
    };
    while let Some(c) = todo.pop_front() {
        if c == ".." {
            stack.pop();
            continue;
        }
        let cur = stack.last().unwrap_or(root);
        let last = todo.is_empty();
        let fd = match rustix::fs::openat(
            cur,
            &c,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) if last && want == Want::Entry => {
                let dir = here(&mut stack)?;
                return Ok(Found::Entry(dir, c));
            }
            Err(rustix::io::Errno::NOENT) if want == Want::MadeDir => {
                match rustix::fs::mkdirat(cur, &c, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(Walk::Os(e)),
                }
                // Whatever the server's umask: replicas must pass through.
                rustix::fs::chmodat(cur, &c, Mode::from_raw_mode(0o755), AtFlags::empty())?;
                rustix::fs::openat(
                    cur,
                    &c,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?
            }
            Err(rustix::io::Errno::NOENT) => return Err(Walk::Missing),
            Err(e) => return Err(Walk::Os(e)),
        };
        let s = rustix::fs::fstat(&fd)?;
        match FileType::from_raw_mode(s.st_mode) {
            FileType::Symlink => {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(Walk::Loop);
                }
                let to = rustix::fs::readlinkat(&fd, "", Vec::new())?;
                let to = PathBuf::from(OsStr::from_bytes(to.to_bytes()));
                if to.is_absolute() {
                    stack.clear();
                }
                push_front(&mut todo, &to);
            }
            _ if last && want == Want::Entry => {
                let dir = here(&mut stack)?;
                return Ok(Found::Entry(dir, c));
            }
            FileType::Directory => {
                if stack.len() >= MAX_DEPTH {
                    return Err(Walk::TooDeep);
                }
                stack.push(fd);
            }
            _ => return Err(Walk::NotDir),
        }
    }
    Ok(Found::Dir(here(&mut stack)?))
}

/// Puts the components of `p` (normal names and `..`) in front of `todo`, in order.
fn push_front(todo: &mut VecDeque<OsString>, p: &Path) {
    for c in p.components().rev() {
        match c {
            Component::Normal(x) => todo.push_front(x.to_owned()),
            Component::ParentDir => todo.push_front("..".into()),
            _ => {}
        }
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

/// What a root file system holds at `rel`, resolved inside it as if it were `/`, if it is a regular file of
/// at most `max_bytes`: its bytes. None when nothing is there; an error for anything else (a FIFO, a device,
/// a directory, a file too large). Opened without blocking (a FIFO never stalls the caller) and never
/// followed out of the root, so an image's `/etc/passwd` can neither freeze the server nor show it a host
/// file.
pub fn read_in_root(root: &Path, rel: &str, max_bytes: u64) -> Result<Option<Vec<u8>>, String> {
    let shown = format!("/{}", clean(Path::new(rel)).display());
    let Some((dir, name)) = entry_in_root(root, rel).map_err(|e| e.at(&shown))? else { return Ok(None) };
    let fd = match rustix::fs::openat(
        &dir,
        &name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(errno(&shown, e)),
    };
    let s = rustix::fs::fstat(&fd).map_err(|e| errno(&shown, e))?;
    if FileType::from_raw_mode(s.st_mode) != FileType::RegularFile {
        return Err(format!("{shown} is not a regular file"));
    }
    if s.st_size as u64 > max_bytes {
        return Err(format!("{shown} is {} bytes, over the {max_bytes} this machine reads", s.st_size));
    }
    let mut out = Vec::new();
    std::fs::File::from(fd).take(max_bytes + 1).read_to_end(&mut out).map_err(|e| format!("{shown}: {e}"))?;
    if out.len() as u64 > max_bytes {
        return Err(format!("{shown} is over the {max_bytes} bytes this machine reads"));
    }
    Ok(Some(out))
}

/// Whether a root file system holds a regular file at `rel` (resolved inside it).
pub fn is_file_in_root(root: &Path, rel: &str) -> bool {
    kind_in_root(root, rel) == Some(FileType::RegularFile)
}

/// Whether anything is at `rel` inside a root file system, resolved inside it (a symlink whose target is not
/// in the root is not there, whatever the host has at that path).
pub fn exists_in_root(root: &Path, rel: &str) -> bool {
    kind_in_root(root, rel).is_some()
}

/// What is at `rel` inside a root file system, resolved inside it (never a symlink: those are followed).
fn kind_in_root(root: &Path, rel: &str) -> Option<FileType> {
    let (dir, name) = entry_in_root(root, rel).ok()??;
    let s = rustix::fs::statat(&dir, &name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
    Some(FileType::from_raw_mode(s.st_mode))
}

/// The directory holding what `rel` names inside `root` (symlinks on the way and at its end followed within
/// the root) and the name there, which is not a symlink (or not there). None when a directory on the way is
/// missing.
fn entry_in_root(root: &Path, rel: &str) -> Result<Option<(OwnedFd, OsString)>, Walk> {
    let root_fd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    match walk(&root_fd, &clean(Path::new(rel)), Want::Entry) {
        Ok(Found::Entry(dir, name)) => Ok(Some((dir, name))),
        Ok(Found::Dir(_)) => Err(Walk::Text("a directory".into())),
        Err(Walk::Missing | Walk::NotDir) => Ok(None),
        Err(e) => Err(e),
    }
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

fn times(secs: u64) -> rustix::fs::Timestamps {
    let t = rustix::fs::Timespec { tv_sec: secs as i64, tv_nsec: 0 };
    rustix::fs::Timestamps { last_access: t, last_modification: t }
}

fn set_mtime(dir: BorrowedFd, name: &OsStr, secs: u64) {
    let _ = rustix::fs::utimensat(dir, name, &times(secs), AtFlags::SYMLINK_NOFOLLOW);
}

/// An I/O error while unpacking; "no space left" is said as such (the caller classes it disk-full).
fn io_err(at: &str, e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(28) {
        return format!("{NO_SPACE}: {at}");
    }
    format!("{at}: {e}")
}

fn errno(at: &str, e: rustix::io::Errno) -> String {
    io_err(at, &std::io::Error::from(e))
}

/// Runs `f` on a thread of its own as user and group `id` with no supplementary groups and no capabilities
/// (None: as this process is). The switch is the thread's alone (Linux keeps credentials per thread; the
/// raw calls do not spread them to the process's other threads, as libc's wrappers would), and the thread
/// ends with `f`, so nothing else ever runs with them. Threads `f` starts inherit them.
pub fn unprivileged<T: Send>(id: Option<u32>, f: impl FnOnce() -> T + Send) -> Result<T, String> {
    std::thread::scope(|scope| {
        let h = std::thread::Builder::new()
            .name("image-unpack".into())
            .spawn_scoped(scope, move || {
                if let Some(id) = id {
                    drop_to(id)
                        .map_err(|e| format!("cannot switch the unpacking thread to uid {id}: {e}"))?;
                }
                Ok(f())
            })
            .map_err(|e| format!("cannot start the unpacking thread: {e}"))?;
        h.join().map_err(|_| "the unpacking thread failed unexpectedly".to_owned())?
    })
}

fn drop_to(id: u32) -> rustix::io::Result<()> {
    use rustix::process::{Gid, Uid};
    rustix::thread::set_thread_groups(&[])?;
    let (g, u) = (Gid::from_raw(id), Uid::from_raw(id));
    rustix::thread::set_thread_res_gid(g, g, g)?;
    // With every uid non-zero, the kernel clears the thread's capabilities.
    rustix::thread::set_thread_res_uid(u, u, u)
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
