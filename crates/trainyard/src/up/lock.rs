//! One server per data dir, and one per SQLite database: `trainyard up` holds an exclusive lock on each for
//! as long as it runs (an `flock`, released by the kernel when the process ends, `kill -9` included), and a
//! second server is refused with the first one's pid rather than left to run every task a second time.

use anyhow::{Result, bail};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// A lock held until dropped (the end of `trainyard up`).
#[derive(Debug)]
pub struct Held {
    _file: std::fs::File,
}

/// Takes the lock at `path` (created if missing), writing this process's pid into it; `what` and `advice`
/// make the refusal when another process holds it.
pub fn take(path: &Path, what: &str, advice: &str) -> Result<Held> {
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot open the lock {}: {e}", path.display()))?;
    use rustix::fs::{FlockOperation, flock};
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let by = if holder.is_empty() { String::new() } else { format!(" (pid {holder})") };
            bail!("another trainyard server{by} is running on {what}; {advice} (lock: {})", path.display());
        }
        Err(e) => bail!("cannot lock {}: {e}", path.display()),
    }
    file.set_len(0)?;
    file.rewind()?;
    write!(file, "{}", std::process::id())?;
    file.flush()?;
    Ok(Held { _file: file })
}

/// The lock of a SQLite database (`PATH.server-lock`), when `url` names one.
pub fn sqlite_lock_path(url: &str) -> Option<PathBuf> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty()).then(|| PathBuf::from(format!("{path}.server-lock")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid_and_the_lock_frees_at_drop() {
        let dir = std::env::temp_dir().join(format!("ty-lock-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.lock");
        let first = take(&path, "this data dir", "stop it first").unwrap();
        let e = take(&path, "this data dir", "stop it first").unwrap_err().to_string();
        assert!(e.contains(&format!("pid {}", std::process::id())) && e.contains("stop it first"), "{e}");
        drop(first);
        take(&path, "this data dir", "stop it first").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sqlite_urls_name_their_lock() {
        assert_eq!(sqlite_lock_path("sqlite:///d/t.db"), Some(PathBuf::from("/d/t.db.server-lock")));
        assert_eq!(sqlite_lock_path("sqlite://t.db?mode=rwc"), Some(PathBuf::from("t.db.server-lock")));
        assert_eq!(sqlite_lock_path("postgres://h/db"), None);
    }
}
