//! Which entries of a packed directory stay home, as git decides it: the `.gitignore` files of the
//! directories from the entry's up to the packed one, then those of the directories above it within its
//! repository (none when it is in none), each repository's `.git/info/exclude`, and a `.trainyardignore`
//! beside any `.gitignore`, in the same syntax.
//!
//! The order is the one the `ignore` crate's walker uses (and the Python client's `_ignore.py` too, which must
//! agree, or the two clients would send different trees for one directory): every `.trainyardignore`, the
//! deepest first, then every `.gitignore`, then every `info/exclude`; the first file with a pattern that
//! matches decides (ignored, or kept by a `!` pattern). Above the packed directory only the directories of
//! its repository count: a `.gitignore` in the home directory (a dotfiles repository's `*`) is not this
//! project's.

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// A file the user may list paths in, as in `.gitignore`, to keep them out of the working directory.
pub const IGNORE_FILE: &str = ".trainyardignore";

/// The ignore files of one directory, by kind.
#[derive(Debug, Default)]
struct DirRules {
    custom: Option<Gitignore>,
    gitignore: Option<Gitignore>,
    exclude: Option<Gitignore>,
}

/// A file's patterns, rooted at `root`; None when there is no such file. Lines that are not patterns are
/// left out (as git does), not refused.
fn read(root: &Path, file: &Path) -> Option<Gitignore> {
    if !file.is_file() {
        return None;
    }
    let mut b = GitignoreBuilder::new(root);
    let _ = b.add(file);
    b.build().ok()
}

/// The repository directory a `.git` stands for: itself, or for a worktree's `.git` file (`gitdir: PATH`)
/// the common directory its `commondir` names.
fn git_common_dir(git: &Path) -> Option<PathBuf> {
    if git.is_dir() {
        return Some(git.to_owned());
    }
    let text = std::fs::read_to_string(git).ok()?;
    let real = PathBuf::from(text.lines().next()?.strip_prefix("gitdir: ")?);
    let common = std::fs::read_to_string(real.join("commondir")).ok()?;
    let common = common.lines().next()?;
    Some(if common.starts_with('.') { real.join(common) } else { PathBuf::from(common) })
}

impl DirRules {
    fn of(dir: &Path) -> DirRules {
        let git = dir.join(".git");
        let exclude = if std::fs::symlink_metadata(&git).is_ok() {
            git_common_dir(&git).and_then(|common| read(dir, &common.join("info").join("exclude")))
        } else {
            None
        };
        DirRules {
            custom: read(dir, &dir.join(IGNORE_FILE)),
            gitignore: read(dir, &dir.join(".gitignore")),
            exclude,
        }
    }

    fn kind(&self, k: usize) -> Option<&Gitignore> {
        [&self.custom, &self.gitignore, &self.exclude][k].as_ref()
    }
}

/// The rules of a packed directory (absolute, without links) and of the directories above it within its
/// repository; each directory's read once, as the walk reaches it.
#[derive(Debug)]
pub(crate) struct Rules {
    root: PathBuf,
    /// The directories above the packed one whose files count, nearest first.
    above: Vec<DirRules>,
    inside: Mutex<HashMap<PathBuf, std::sync::Arc<DirRules>>>,
}

impl Rules {
    pub(crate) fn new(root: &Path) -> Rules {
        // The repository's top: the nearest directory with a `.git`, the packed one included (then nothing
        // above it counts).
        let mut above = Vec::new();
        let top = root.ancestors().find(|d| std::fs::symlink_metadata(d.join(".git")).is_ok());
        if let Some(top) = top.filter(|t| *t != root) {
            for d in root.ancestors().skip(1) {
                above.push(DirRules::of(d));
                if d == top {
                    break;
                }
            }
        }
        Rules { root: root.to_owned(), above, inside: Mutex::new(HashMap::new()) }
    }

    fn inside(&self, dir: &Path) -> std::sync::Arc<DirRules> {
        let mut m = self.inside.lock().unwrap_or_else(|e| e.into_inner());
        m.entry(dir.to_owned()).or_insert_with(|| std::sync::Arc::new(DirRules::of(dir))).clone()
    }

    /// Whether the entry at `path` (under the packed directory) stays home.
    pub(crate) fn ignored(&self, path: &Path, is_dir: bool) -> bool {
        let chain: Vec<std::sync::Arc<DirRules>> = path
            .ancestors()
            .skip(1)
            .take_while(|d| d.starts_with(&self.root))
            .map(|d| self.inside(d))
            .collect();
        for k in 0..3 {
            let rules = chain.iter().map(|r| &**r).chain(&self.above);
            for gi in rules.filter_map(|r| r.kind(k)) {
                match gi.matched(path, is_dir) {
                    Match::None => continue,
                    Match::Ignore(_) => return true,
                    Match::Whitelist(_) => return false,
                }
            }
        }
        false
    }
}
