//! The root being built: the directory handles walked to, kept between entries, and the changes a layer
//! makes through them (directories made, entries removed).

use super::walk::{Found, MAX_DEPTH, Walk, Want, names, walk};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Directory handles kept between entries.
const MAX_KEPT_DIRS: usize = 4096;

/// The root being built: its handle, and handles of directories walked to (valid until anything is removed).
#[derive(Debug)]
pub(super) struct Root {
    pub(super) fd: Rc<OwnedFd>,
    pub(super) dirs: HashMap<PathBuf, Rc<OwnedFd>>,
}

impl Root {
    /// The directory `rel` (a layer's path, cleaned) resolves to inside the root, symlinks followed within
    /// it. Directories that are not there are made (mode 0755) when `make`, else the answer is None; a
    /// component that is a file is an error either way.
    pub(super) fn dir(&mut self, rel: &Path, make: bool) -> Result<Option<Rc<OwnedFd>>, Walk> {
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
    pub(super) fn make_dir(&mut self, parent: BorrowedFd, name: &OsStr, mode: u32) -> Result<(), Walk> {
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
    pub(super) fn remove(&mut self, parent: BorrowedFd, name: &OsStr, depth: usize) -> Result<(), Walk> {
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
    pub(super) fn empty_below(
        &mut self,
        dir: BorrowedFd,
        dir_rel: &Path,
        ours: &HashSet<PathBuf>,
    ) -> Result<(), Walk> {
        for name in names(dir)? {
            if !ours.contains(&dir_rel.join(&name)) {
                self.remove(dir, &name, 0)?;
            }
        }
        Ok(())
    }
}
