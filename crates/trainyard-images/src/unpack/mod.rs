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
//!
//! [`Root::dir`]: root::Root::dir

mod layer;
mod root;
mod unprivileged;
mod walk;

pub use layer::{Unpacker, apply_layer, shared_mode};
pub use unprivileged::unprivileged;
pub use walk::{exists_in_root, is_file_in_root, read_in_root};

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

/// How an unpack that ran out of space starts its message.
pub const NO_SPACE: &str = "no space left on the image cache's disk";
/// How an unpack past one of its [`Limits`] starts its message.
pub const TOO_LARGE: &str = "the image is larger than this machine allows";

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

#[cfg(test)]
mod tests;
