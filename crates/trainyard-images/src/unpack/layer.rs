//! Applying a layer: its tar stream (inflated on a thread of its own when gzip) read entry by entry,
//! whiteouts and opaque markers applied, files written inside the root within the [`Limits`].

use super::root::Root;
use super::walk::{Walk, clean};
use super::{Applied, Limits, NO_SPACE, TOO_LARGE, errno, io_err};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// How often the cache's disk is asked how much room it has left: every this many bytes or entries.
const DISK_CHECK_BYTES: u64 = 64 << 20;
pub(super) const DISK_CHECK_ENTRIES: u64 = 4096;

const WHITEOUT: &str = ".wh.";
const OPAQUE: &str = ".wh..wh..opq";

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
