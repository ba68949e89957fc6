//! The walk inside a root file system: every path resolved one component at a time by descriptors, symlinks
//! followed as if the root were `/`, never out of it; and what reads a root that way ([`read_in_root`]).

use super::errno;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

/// How deep symlinks may nest while a path is resolved.
const MAX_LINK_HOPS: u32 = 40;
/// How deep a directory may be (the kernel's `PATH_MAX` allows about this many one-letter names).
pub(super) const MAX_DEPTH: usize = 2048;

/// Why a walk failed.
#[derive(Debug)]
pub(super) enum Walk {
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
    pub(super) fn at(self, at: &str) -> String {
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

/// The names in a directory (not `.` and `..`).
pub(super) fn names(dir: impl AsFd) -> Result<Vec<OsString>, Walk> {
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
pub(super) enum Want {
    /// A directory, made where missing.
    MadeDir,
    /// A directory that is there.
    Dir,
    /// The directory holding the last name, which is followed when it is a symlink.
    Entry,
}

/// What a [`walk`] reached.
pub(super) enum Found {
    Dir(OwnedFd),
    /// A directory and a name in it (not a symlink; maybe not there).
    Entry(OwnedFd, OsString),
}

/// Walks `rel` from `root` one component at a time, never following anything out of the root: each
/// component is opened without following it; a symlink's target is walked in its place (from the root when
/// absolute); `..` goes back one directory and never above the root.
pub(super) fn walk(root: &OwnedFd, rel: &Path, want: Want) -> Result<Found, Walk> {
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
pub(super) fn clean(p: &Path) -> PathBuf {
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
