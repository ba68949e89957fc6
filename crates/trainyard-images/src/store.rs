//! The cache on disk, under one dir:
//!
//! - `blobs/sha256/HEX`: layers as the registry sent them, each written under `tmp/` first and renamed into
//!   place only once its bytes hash to its digest;
//! - `images/HEX/` (HEX of the image manifest's digest): `rootfs/` (the layers applied, read-only to every
//!   replica), `image.json` ([`Meta`]) and `used` (its modification time is when a task last used it);
//! - `tmp/`: work in progress. An image is unpacked under `tmp/` and renamed into `images/` whole, so a pull
//!   that a crash interrupts leaves nothing half-visible; `tmp/` is emptied when the cache is opened.

use crate::error::{FailureClass, PullError};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What an image's config says that Trainyard honours.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `NAME=value` entries, in the image's order.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `user`, `uid`, `user:group` or `uid:gid`, as the image says it.
    #[serde(default)]
    pub user: Option<String>,
}

impl ImageConfig {
    /// Reads the parts of an OCI or Docker image config document that Trainyard honours.
    pub fn from_config_json(text: &str) -> Result<ImageConfig, String> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("the image's config is not JSON: {e}"))?;
        let c = &v["config"];
        let env = c["Env"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        let s = |k: &str| c[k].as_str().filter(|x| !x.is_empty()).map(str::to_owned);
        Ok(ImageConfig { env, working_dir: s("WorkingDir"), user: s("User") })
    }
}

/// What the cache knows of one image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// The image manifest's digest (`sha256:...`): the image's identity here.
    pub digest: String,
    /// The references it was pulled by (canonical, tag or digest).
    pub references: Vec<String>,
    /// Its layers' digests, lowest first.
    pub layers: Vec<String>,
    pub config: ImageConfig,
    /// Bytes of regular files in its root file system.
    pub rootfs_bytes: u64,
    /// Whether the root file system has `bash` (tasks run their command with `bash -c`).
    pub bash: bool,
    /// When it was unpacked, in ms since the epoch.
    pub pulled_ms: u64,
    /// Its users and groups, read once when it was unpacked (None in the meta of an image unpacked before
    /// they were kept: read when the image is next pulled).
    #[serde(default)]
    pub accounts: Option<Accounts>,
}

/// An image's own users and groups: its `/etc/passwd` and `/etc/group`, read when it is unpacked, inside its
/// root file system, regular files only and at most [`Accounts::MAX_BYTES`] each, so that nothing later
/// reads the image's files on the server's behalf.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accounts {
    pub passwd: Option<String>,
    pub group: Option<String>,
}

impl Accounts {
    /// The most either file may hold.
    pub const MAX_BYTES: u64 = 1 << 20;

    /// Reads them from a root file system (an error when either is there but not a regular file, or too
    /// large).
    pub fn read(rootfs: &Path) -> Result<Accounts, String> {
        let one = |name: &str| -> Result<Option<String>, String> {
            let bytes = crate::unpack::read_in_root(rootfs, &format!("etc/{name}"), Accounts::MAX_BYTES)?;
            Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
        };
        Ok(Accounts { passwd: one("passwd")?, group: one("group")? })
    }
}

/// One image in the cache, for listings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cached {
    pub digest: String,
    pub references: Vec<String>,
    /// Its root file system plus the layers only it uses.
    pub bytes: u64,
    pub last_used_ms: u64,
    pub pulled_ms: u64,
}

/// The cache's dirs.
#[derive(Debug, Clone)]
pub struct Store {
    pub dir: PathBuf,
    /// The group whose members (the sandboxes' users) may pass through to the root file systems.
    pub passage_gid: Option<u32>,
    /// How images are unpacked here.
    pub unpack: Unpack,
}

/// How images are unpacked: as whom, and within what bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unpack {
    /// The uid (and gid) the unpacking thread switches to, which owns every file of the root file systems
    /// (None: as this process runs). The server, as root, unpacks as a uid of its own that no replica runs
    /// as.
    pub as_id: Option<u32>,
    pub limits: crate::unpack::Limits,
    /// The size the whole cache is kept under: a pull whose layers alone are larger fails at once.
    pub cache_max_bytes: Option<u64>,
}

fn hex(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Store {
    /// Opens (or makes) the cache and empties `tmp/` of anything an interrupted pull left.
    pub fn open(dir: &Path, passage_gid: Option<u32>) -> std::io::Result<Store> {
        let s = Store { dir: dir.to_path_buf(), passage_gid, unpack: Unpack::default() };
        for d in [s.dir.clone(), s.dir.join("blobs"), s.dir.join("blobs/sha256"), s.images_dir(), s.tmp_dir()]
        {
            std::fs::create_dir_all(&d)?;
        }
        s.passage(&s.dir)?;
        s.passage(&s.images_dir())?;
        std::fs::set_permissions(s.dir.join("blobs"), std::fs::Permissions::from_mode(0o700))?;
        std::fs::set_permissions(s.tmp_dir(), std::fs::Permissions::from_mode(0o700))?;
        if let Ok(rd) = std::fs::read_dir(s.tmp_dir()) {
            for e in rd.flatten() {
                let _ = remove(&e.path());
            }
        }
        Ok(s)
    }

    /// A dir the sandboxes' users may pass through (not list): root's, group `passage_gid`, mode 0710.
    fn passage(&self, d: &Path) -> std::io::Result<()> {
        match self.passage_gid {
            Some(gid) => {
                rustix::fs::chown(d, Some(rustix::fs::Uid::ROOT), Some(rustix::fs::Gid::from_raw(gid)))?;
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o710))
            }
            None => std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)),
        }
    }

    pub fn images_dir(&self) -> PathBuf {
        self.dir.join("images")
    }
    pub fn tmp_dir(&self) -> PathBuf {
        self.dir.join("tmp")
    }
    pub fn blob(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs/sha256").join(hex(digest))
    }
    pub fn image_dir(&self, digest: &str) -> PathBuf {
        self.images_dir().join(hex(digest))
    }
    pub fn rootfs(&self, digest: &str) -> PathBuf {
        self.image_dir(digest).join("rootfs")
    }

    /// A fresh dir under `tmp/`.
    pub fn scratch(&self, what: &str) -> Result<PathBuf, PullError> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = self.tmp_dir().join(format!("{what}-{}-{n}", std::process::id()));
        std::fs::create_dir(&p).map_err(|e| PullError::io("making a work dir in the image cache", &e))?;
        Ok(p)
    }

    /// The image's meta, if it is in the cache (whole: only whole images are under `images/`).
    pub fn meta(&self, digest: &str) -> Option<Meta> {
        let bytes = std::fs::read(self.image_dir(digest).join("image.json")).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Every image in the cache.
    pub fn all(&self) -> Vec<Meta> {
        let Ok(rd) = std::fs::read_dir(self.images_dir()) else { return Vec::new() };
        let mut out: Vec<Meta> = rd
            .flatten()
            .filter_map(|e| self.meta(&format!("sha256:{}", e.file_name().to_string_lossy())))
            .collect();
        out.sort_by(|a, b| a.digest.cmp(&b.digest));
        out
    }

    /// Marks the image used now; records `reference` among those it is known by.
    pub fn touch(&self, digest: &str, reference: Option<&str>) {
        let dir = self.image_dir(digest);
        let _ = std::fs::write(dir.join("used"), b"");
        if let Some(r) = reference
            && let Some(mut m) = self.meta(digest)
            && !m.references.iter().any(|x| x == r)
        {
            m.references.push(r.to_owned());
            let _ = write_meta(&dir, &m);
        }
    }

    pub fn last_used_ms(&self, digest: &str) -> u64 {
        std::fs::metadata(self.image_dir(digest).join("used"))
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64)
    }

    /// Moves a finished image (`work` holds `rootfs/`) into place. Another pull of the same image that got
    /// there first wins; this one's work is dropped.
    pub fn commit(&self, work: &Path, meta: &Meta) -> Result<(), PullError> {
        write_meta(work, meta).map_err(|e| PullError::io("writing the image's meta", &e))?;
        std::fs::write(work.join("used"), b"").map_err(|e| PullError::io("writing the image's meta", &e))?;
        self.passage(work).map_err(|e| PullError::io("opening the image to the sandboxes", &e))?;
        let to = self.image_dir(&meta.digest);
        match std::fs::rename(work, &to) {
            Ok(()) => Ok(()),
            Err(_) if to.join("image.json").exists() => {
                let _ = remove(work);
                Ok(())
            }
            Err(e) => Err(PullError::io("moving the image into the cache", &e)),
        }
    }

    /// Removes an image: renamed under `tmp/` first (gone from `images/` at once), then deleted.
    pub fn remove_image(&self, digest: &str) -> std::io::Result<()> {
        let from = self.image_dir(digest);
        let to = self.tmp_dir().join(format!("gone-{}", hex(digest)));
        std::fs::rename(&from, &to)?;
        remove(&to)
    }

    /// Bytes of a blob in the cache (0 when absent).
    pub fn blob_bytes(&self, digest: &str) -> u64 {
        std::fs::metadata(self.blob(digest)).map_or(0, |m| m.len())
    }

    /// Digests of every blob in the cache.
    pub fn blobs(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.dir.join("blobs/sha256")) else { return Vec::new() };
        rd.flatten().map(|e| format!("sha256:{}", e.file_name().to_string_lossy())).collect()
    }
}

fn write_meta(dir: &Path, m: &Meta) -> std::io::Result<()> {
    let tmp = dir.join("image.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(m).unwrap_or_default())?;
    std::fs::rename(tmp, dir.join("image.json"))
}

fn remove(p: &Path) -> std::io::Result<()> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
        Ok(_) => std::fs::remove_file(p),
        Err(_) => Ok(()),
    }
}

/// A rootfs without `bash` at `/bin/bash` or `/usr/bin/bash` cannot run a task's command.
pub fn has_bash(rootfs: &Path) -> bool {
    ["bin/bash", "usr/bin/bash"].iter().any(|p| crate::unpack::is_file_in_root(rootfs, p))
}

/// The error for an image without bash.
pub fn no_bash(image: &str) -> PullError {
    PullError::new(
        FailureClass::Invalid,
        format!(
            "image {image} has no bash (/bin/bash or /usr/bin/bash): Trainyard runs the task's command with \
             `bash -c`, so the image must carry bash"
        ),
    )
}
