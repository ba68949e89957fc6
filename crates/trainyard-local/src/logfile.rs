//! A replica's log file: timestamped lines, rotated at its size limit with a record of where it starts.

use super::clock::{now_ms, rfc3339_ms};
use super::files::write_atomic;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use trainyard_core::lifecycle::Reason;

/// The replica's log file, rotated at its limit.
pub(super) struct LogFile {
    dir: PathBuf,
    file: std::fs::File,
    /// Bytes in `log` now.
    len: u64,
    max: u64,
    /// Offset of `log`'s first byte in the whole output.
    base: u64,
    /// Events to report (rotations), drained at the end and as they happen.
    events: Vec<(Reason, String)>,
}

impl LogFile {
    pub(super) fn open(dir: &Path, max: u64) -> std::io::Result<LogFile> {
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(dir.join("log"))?;
        let len = file.metadata()?.len();
        let base = log_base(dir);
        Ok(LogFile { dir: dir.to_owned(), file, len, max: max.max(4096), base, events: Vec::new() })
    }

    pub(super) fn write(&mut self, line: &[u8]) {
        if self.len > 0 && self.len + line.len() as u64 > self.max {
            self.rotate();
        }
        if self.file.write_all(line).is_ok() {
            self.len += line.len() as u64;
        }
    }

    pub(super) fn rotate(&mut self) {
        use std::os::unix::fs::OpenOptionsExt;
        let (log, old) = (self.dir.join("log"), self.dir.join("log.1"));
        let dropped = std::fs::metadata(&old).map_or(0, |m| m.len());
        if std::fs::rename(&log, &old).is_err() {
            return;
        }
        let Ok(file) = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&log) else {
            return;
        };
        self.base += self.len;
        let _ = write_atomic(&self.dir.join("log.base"), self.base.to_string().as_bytes());
        self.file = file;
        self.len = 0;
        self.events.push((
            Reason::LogRotated,
            format!(
                "the log reached {} MiB and was rotated; {} MiB of its oldest lines were dropped",
                self.max / (1024 * 1024),
                dropped / (1024 * 1024)
            ),
        ));
    }

    pub(super) fn take_events(&mut self) -> Vec<(Reason, String)> {
        std::mem::take(&mut self.events)
    }
}

pub(super) fn append_log(log: &Arc<Mutex<LogFile>>, tag: char, text: &str) {
    let line = format!("{} {tag} {text}\n", rfc3339_ms(now_ms()));
    if let Ok(mut f) = log.lock() {
        f.write(line.as_bytes());
    }
}

/// Where a replica's `log` starts in its whole output (0 until it first rotated).
pub(super) fn log_base(replica_dir: &Path) -> u64 {
    std::fs::read_to_string(replica_dir.join("log.base"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}
