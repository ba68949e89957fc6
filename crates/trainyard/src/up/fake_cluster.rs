//! The fake backend's runs kept in a directory several servers on one machine share
//! (`TRAINYARD_FAKE_CLUSTER=DIR`, for tests and demos of several servers): as a cluster keeps its jobs, a run
//! one leader launched goes on under the next. Each launch makes its run's file, `DIR/runs/TASK.ATTEMPT.json`,
//! whole or not at all; a launch of an attempt that has one already (launched twice) is a line of
//! `DIR/launched-again` (`TASK ATTEMPT`), so a test sees each attempt launched once.

use std::io::Write;
use std::path::PathBuf;
use trainyard_runtime::AttemptKey;
use trainyard_runtime::fake::{SharedRun, SharedRuns};

#[derive(Debug)]
pub struct DirRuns {
    dir: PathBuf,
}

impl DirRuns {
    pub fn open(dir: PathBuf) -> std::io::Result<DirRuns> {
        std::fs::create_dir_all(dir.join("runs"))?;
        Ok(DirRuns { dir })
    }

    fn file(&self, key: &AttemptKey) -> PathBuf {
        let id: String = key
            .task_id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
            .collect();
        self.dir.join("runs").join(format!("{id}.{}.json", key.attempt))
    }

    fn write(&self, key: &AttemptKey, run: &SharedRun) {
        let path = self.file(key);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let text = serde_json::to_string(run).expect("a run serializes");
        if std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &path)).is_err() {
            eprintln!("trainyard: the fake cluster cannot keep {}", path.display());
        }
    }
}

impl SharedRuns for DirRuns {
    fn find(&self, key: &AttemptKey) -> Option<SharedRun> {
        serde_json::from_str(&std::fs::read_to_string(self.file(key)).ok()?).ok()
    }

    fn launched(&self, key: &AttemptKey, run: &SharedRun) {
        let path = self.file(key);
        let tmp = path.with_extension(format!("new{}", std::process::id()));
        let text = serde_json::to_string(run).expect("a run serializes");
        // Linked into place whole, and only where no run is: a second launch of the attempt is told apart.
        let made = std::fs::write(&tmp, text).and_then(|()| std::fs::hard_link(&tmp, &path));
        let _ = std::fs::remove_file(&tmp);
        match made {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let line = format!("{} {}\n", key.task_id, key.attempt);
                let log = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(self.dir.join("launched-again"));
                // One write of one short line: appends from several processes do not interleave.
                if log.and_then(|mut f| f.write_all(line.as_bytes())).is_err() {
                    eprintln!(
                        "trainyard: the fake cluster cannot record a second launch in {}",
                        self.dir.display()
                    );
                }
                self.write(key, run);
            }
            Err(e) => eprintln!("trainyard: the fake cluster cannot keep {}: {e}", path.display()),
        }
    }

    fn update(&self, key: &AttemptKey, run: &SharedRun) {
        self.write(key, run);
    }
}
