//! The client's side: a directory made into a manifest, and the files the server lacks sent as tar streams.

use crate::manifest::{Entry, Kind, Manifest, hex, human, link_inside};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

pub use crate::rules::IGNORE_FILE;

/// A packed directory: its manifest, and where each digest's content is on this machine.
#[derive(Debug, Default)]
pub struct Packed {
    pub manifest: Manifest,
    pub sources: BTreeMap<String, PathBuf>,
}

/// Packs `dir`: every entry git would keep (its `.gitignore` files, those of the directories above it
/// within its repository, `.git/info/exclude` and [`IGNORE_FILE`] are honoured; `.git` itself is left out),
/// each file hashed. Err lists every problem at once: a link that leads out of `dir` or is absolute, a
/// special file (a socket, a FIFO, a device), a name that is not UTF-8, a file that cannot be read, and
/// files that add up to more than `max_bytes`.
pub fn pack(dir: &Path, max_bytes: u64) -> Result<Packed, Vec<String>> {
    let mut problems = Vec::new();
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(vec![format!("{}: not a directory", dir.display())]),
        Err(e) => return Err(vec![format!("{}: {e}", dir.display())]),
    }
    // Walked from its real path, so that the directories above it are the ones on disk.
    let root = match dir.canonicalize() {
        Ok(r) => r,
        Err(e) => return Err(vec![format!("{}: {e}", dir.display())]),
    };
    let rules = std::sync::Arc::new(crate::rules::Rules::new(&root));
    // The walker reads no ignore file itself: `rules` decides, as git does (see `rules.rs`).
    let walk = ignore::WalkBuilder::new(&root)
        .standard_filters(false)
        .follow_links(false)
        .filter_entry(move |e| {
            e.depth() == 0
                || (e.file_name() != ".git"
                    && !rules.ignored(e.path(), e.file_type().is_some_and(|t| t.is_dir())))
        })
        .sort_by_file_name(|a, b| a.cmp(b))
        .build();
    let mut packed = Packed::default();
    for item in walk {
        let entry = match item {
            Ok(e) => e,
            Err(e) => {
                problems.push(e.to_string());
                continue;
            }
        };
        let full = entry.path();
        let Ok(rel) = full.strip_prefix(&root) else { continue };
        if rel.as_os_str().is_empty() {
            continue;
        }
        let Some(path) = rel.to_str().map(str::to_owned) else {
            problems.push(format!(
                "{}: the name is not UTF-8; rename it or list it in {IGNORE_FILE}",
                rel.display()
            ));
            continue;
        };
        let Some(ft) = entry.file_type() else { continue };
        let mut e = Entry {
            path: path.clone(),
            kind: Kind::Dir,
            sha256: None,
            size: 0,
            executable: false,
            target: None,
        };
        if ft.is_dir() {
        } else if ft.is_symlink() {
            let target = match std::fs::read_link(full) {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{path}: {e}"));
                    continue;
                }
            };
            let Some(t) = target.to_str() else {
                problems.push(format!("{path}: a link whose target is not UTF-8"));
                continue;
            };
            if let Err(why) = link_inside(&path, t) {
                problems.push(format!("{path}: a link that {why}; list it in {IGNORE_FILE} to leave it out"));
                continue;
            }
            e.kind = Kind::Link;
            e.target = Some(t.to_owned());
        } else if ft.is_file() {
            match hash_file(full) {
                Ok((digest, size, exec)) => {
                    e.kind = Kind::File;
                    e.size = size;
                    e.executable = exec;
                    packed.sources.entry(digest.clone()).or_insert_with(|| full.to_owned());
                    e.sha256 = Some(digest);
                }
                Err(why) => {
                    problems.push(format!("{path}: {why}"));
                    continue;
                }
            }
        } else {
            problems.push(format!(
                "{path}: a special file (a socket, FIFO or device) cannot travel; list it in {IGNORE_FILE}"
            ));
            continue;
        }
        packed.manifest.entries.push(e);
    }
    let bytes = packed.manifest.bytes();
    if bytes > max_bytes {
        problems.push(format!(
            "{}: the files to send add up to {}, over the {} an upload may hold; leave large data out with \
             {IGNORE_FILE} (a dataset or a volume carries it better)",
            dir.display(),
            human(bytes),
            human(max_bytes)
        ));
    }
    if problems.is_empty() { Ok(packed) } else { Err(problems) }
}

/// A file's SHA-256, size and whether its owner may run it.
fn hash_file(path: &Path) -> Result<(String, u64, bool), String> {
    use std::os::unix::fs::PermissionsExt;
    let mut f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let meta = f.metadata().map_err(|e| e.to_string())?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        size += n as u64;
        h.update(&buf[..n]);
    }
    Ok((hex(&h.finalize()), size, meta.permissions().mode() & 0o100 != 0))
}

/// The digests in `missing` in batches of about `batch` bytes each (a larger file alone), each batch a tar
/// stream whose entries are named by digest, in the order given. A file that changed since it was packed
/// no longer has its digest's content: the server refuses the stream (it checks every file).
pub fn batches<'a>(
    packed: &'a Packed,
    missing: &'a [String],
    batch: u64,
) -> impl Iterator<Item = Result<(Vec<u8>, usize), String>> + 'a {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= missing.len() {
            return None;
        }
        let mut b = tar::Builder::new(Vec::new());
        let (mut bytes, mut n) = (0u64, 0usize);
        while at < missing.len() && (n == 0 || bytes < batch) {
            let digest = &missing[at];
            at += 1;
            let Some(src) = packed.sources.get(digest) else {
                return Some(Err(format!(
                    "the server asked for {digest}, which this directory does not hold"
                )));
            };
            let data = match std::fs::read(src) {
                Ok(d) => d,
                Err(e) => return Some(Err(format!("{}: {e}", src.display()))),
            };
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            if let Err(e) = b.append_data(&mut h, digest, data.as_slice()) {
                return Some(Err(e.to_string()));
            }
            bytes += data.len() as u64;
            n += 1;
        }
        Some(b.into_inner().map(|v| (v, n)).map_err(|e| e.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ty-pack-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("pkg/sub")).unwrap();
        std::fs::write(d.join("pkg/__init__.py"), "X = 1\n").unwrap();
        std::fs::write(d.join("pkg/sub/data.txt"), "data\n").unwrap();
        std::fs::write(d.join("run.sh"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(d.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(d.join(".gitignore"), "*.ckpt\nout/\n").unwrap();
        std::fs::write(d.join(IGNORE_FILE), "secret.txt\n").unwrap();
        std::fs::write(d.join("model.ckpt"), "big").unwrap();
        std::fs::create_dir_all(d.join("out")).unwrap();
        std::fs::write(d.join("out/x"), "x").unwrap();
        std::fs::write(d.join("secret.txt"), "s").unwrap();
        std::fs::create_dir_all(d.join(".git")).unwrap();
        std::fs::write(d.join(".git/HEAD"), "ref").unwrap();
        std::os::unix::fs::symlink("pkg/__init__.py", d.join("init.py")).unwrap();
        d
    }

    #[test]
    fn ignored_files_and_git_stay_home() {
        let d = tree("ignored");
        let p = pack(&d, 1 << 20).unwrap();
        let paths: Vec<&str> = p.manifest.entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                ".gitignore",
                ".trainyardignore",
                "init.py",
                "pkg",
                "pkg/__init__.py",
                "pkg/sub",
                "pkg/sub/data.txt",
                "run.sh"
            ]
        );
        let run = p.manifest.entries.iter().find(|e| e.path == "run.sh").unwrap();
        assert!(run.executable);
        assert!(p.manifest.check(1 << 20).is_empty());
        // The tar batches carry each missing digest once, named by it.
        let missing: Vec<String> = p.sources.keys().cloned().collect();
        let all: Vec<(Vec<u8>, usize)> = batches(&p, &missing, 8).collect::<Result<_, _>>().unwrap();
        assert_eq!(all.iter().map(|b| b.1).sum::<usize>(), missing.len());
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Above the packed directory, only its repository's ignore files count: a `.gitignore` of `*` in a
    /// directory above the repository (a home directory's dotfiles) leaves nothing out, the repository's own
    /// `.gitignore` and `info/exclude` do, and a `.trainyardignore` may keep what they leave out.
    #[test]
    fn ignore_files_above_count_within_the_repository_only() {
        let home = std::env::temp_dir().join(format!("ty-pack-above-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&home);
        let (repo, proj) = (home.join("repo"), home.join("repo/proj"));
        std::fs::create_dir_all(repo.join(".git/info")).unwrap();
        std::fs::create_dir_all(&proj).unwrap();
        std::fs::write(home.join(".gitignore"), "*\n").unwrap();
        std::fs::write(repo.join(".gitignore"), "*.log\n").unwrap();
        std::fs::write(repo.join(".git/info/exclude"), "secret\n").unwrap();
        for f in ["train.py", "a.log", "keep.log", "secret"] {
            std::fs::write(proj.join(f), f).unwrap();
        }
        std::fs::write(proj.join(IGNORE_FILE), "!keep.log\n").unwrap();
        let paths = |d: &Path| -> Vec<String> {
            pack(d, 1 << 20).unwrap().manifest.entries.into_iter().map(|e| e.path).collect()
        };
        assert_eq!(paths(&proj), [IGNORE_FILE, "keep.log", "train.py"]);
        // Outside any repository, nothing above counts: the home directory's `*` included.
        let loose = home.join("loose");
        std::fs::create_dir_all(&loose).unwrap();
        std::fs::write(loose.join("train.py"), "x").unwrap();
        assert_eq!(paths(&loose), ["train.py"]);
        // The repository's top packed itself: its own files, nothing above it.
        let top = paths(&repo);
        assert!(
            top.contains(&"proj/train.py".to_owned()) && !top.contains(&"proj/a.log".to_owned()),
            "{top:?}"
        );
        let _ = std::fs::remove_dir_all(&home);
    }

    #[test]
    fn every_bad_entry_is_named_before_anything_is_sent() {
        let d = tree("bad");
        std::os::unix::fs::symlink("/etc/passwd", d.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../x", d.join("pkg/out")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.join("fifo"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        use std::os::unix::ffi::OsStrExt;
        std::fs::write(d.join(std::ffi::OsStr::from_bytes(b"bad\xffname")), "x").unwrap();
        let all = pack(&d, 4).unwrap_err().join("\n");
        for want in [
            "abs: a link that links to \"/etc/passwd\"",
            "pkg/out: a link that links to \"../../x\", outside",
            "fifo: a special file",
            "bad\u{fffd}name: the name is not UTF-8",
            "over the 4 B an upload may hold",
        ] {
            assert!(all.contains(want), "{want} not in:\n{all}");
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}
