//! Fuzzes the image unpacker (the security boundary between a tenant's layers and the host): the input is
//! read as up to three layers of entries (dirs, files, symlinks, hard links, FIFOs, whiteouts, opaque
//! markers) over a small alphabet of names, `..`, and link targets that would leave the root if followed on
//! the host (absolute paths to a dir beside the root, climbs above it). The layers are applied in order onto
//! a fresh root; afterwards the dir beside it must hold exactly what it held, and the scratch dir nothing but
//! the two. An unpack error is fine; a change outside the root, or a panic, is a finding.
//!
//! The unpacker's source is compiled in directly (it needs only `tar`, `flate2` and `rustix`), so this build
//! does not instrument the registry client and TLS stack the rest of its crate carries.

#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../crates/trainyard-images/src/unpack/mod.rs"]
mod unpack;

use libfuzzer_sys::fuzz_target;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

/// `/tmp/tyfz-PID`: `root/` (what the layers build) and `host/` (what must never change) side by side.
static SCRATCH: LazyLock<PathBuf> = LazyLock::new(|| {
    let d = PathBuf::from(format!("/tmp/tyfz-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("host/dir")).unwrap();
    std::fs::write(d.join("host/victim"), "host").unwrap();
    std::fs::write(d.join("host/dir/inner"), "host").unwrap();
    d
});

/// Names a path may be built from: plain names, `..`, `.`, and the host dir's own name (so that a climb
/// lands on it when followed on the host).
const NAMES: &[&str] = &["a", "b", "c", "..", ".", "host", "victim", "dir", "inner", "d"];

/// A path of 1-4 names from the input.
fn path(data: &mut &[u8]) -> String {
    let n = 1 + take(data) as usize % 4;
    (0..n).map(|_| NAMES[take(data) as usize % NAMES.len()]).collect::<Vec<_>>().join("/")
}

/// A link target: a path, the host dir by its absolute path, or a climb to it.
fn target(data: &mut &[u8]) -> String {
    let host = SCRATCH.join("host");
    match take(data) % 5 {
        0 => host.display().to_string(),
        1 => format!("{}/{}", host.display(), path(data)),
        2 => format!("{}host/{}", "../".repeat(1 + take(data) as usize % 6), path(data)),
        3 => format!("/{}", path(data)),
        _ => path(data),
    }
}

fn take(data: &mut &[u8]) -> u8 {
    match data.split_first() {
        Some((b, rest)) => {
            *data = rest;
            *b
        }
        None => 0,
    }
}

/// One layer of up to 16 entries from the input, names written raw (a hostile layer's are).
fn layer(data: &mut &[u8]) -> Vec<u8> {
    fn put(field: &mut [u8; 100], text: &str) {
        let n = text.len().min(99);
        *field = [0; 100];
        field[..n].copy_from_slice(&text.as_bytes()[..n]);
    }
    let mut b = tar::Builder::new(Vec::new());
    let n = take(data) % 17;
    for _ in 0..n {
        let kind = take(data) % 8;
        let mut p = path(data);
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o755);
        h.set_size(0);
        let mut body: &[u8] = b"";
        let mut link = None;
        match kind {
            0 => h.set_entry_type(tar::EntryType::Directory),
            1 => {
                h.set_entry_type(tar::EntryType::Regular);
                body = b"layer";
                h.set_size(body.len() as u64);
            }
            2 => {
                h.set_entry_type(tar::EntryType::Symlink);
                link = Some(target(data));
            }
            3 => {
                h.set_entry_type(tar::EntryType::Link);
                link = Some(path(data));
            }
            4 => h.set_entry_type(tar::EntryType::Fifo),
            5 => {
                h.set_entry_type(tar::EntryType::Regular);
                let (dir, name) = p.rsplit_once('/').unwrap_or(("", &p));
                p = format!("{dir}/.wh.{name}");
            }
            6 => {
                h.set_entry_type(tar::EntryType::Regular);
                p = format!("{p}/.wh..wh..opq");
            }
            _ => {
                h.set_entry_type(tar::EntryType::Regular);
                p = format!("{p}/{}", path(data));
            }
        }
        put(&mut h.as_old_mut().name, &p);
        if let Some(l) = link {
            put(&mut h.as_old_mut().linkname, &l);
        }
        h.set_cksum();
        b.append(&h, body).unwrap();
    }
    b.into_inner().unwrap()
}

/// Every path under `dir`, with what each file holds.
fn listing(top: &Path, dir: &Path, out: &mut Vec<(String, Option<String>)>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        let t = e.file_type().unwrap();
        let text = if t.is_file() { std::fs::read_to_string(&p).ok() } else { None };
        out.push((p.strip_prefix(top).unwrap().display().to_string(), text));
        if t.is_dir() {
            listing(top, &p, out);
        }
    }
}

fuzz_target!(|input: &[u8]| {
    let scratch = &*SCRATCH;
    let root = scratch.join("root");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir(&root).unwrap();
    let mut data = input;
    let layers: Vec<Vec<u8>> = (0..1 + take(&mut data) % 3).map(|_| layer(&mut data)).collect();
    let mut u = unpack::Unpacker::new(&root, unpack::Limits::unbounded()).unwrap();
    for l in &layers {
        if u.apply(&l[..]).is_err() {
            break;
        }
    }
    let mut host = Vec::new();
    listing(scratch, &scratch.join("host"), &mut host);
    host.sort();
    let want = |p: &str, t: Option<&str>| (p.to_owned(), t.map(str::to_owned));
    assert_eq!(
        host,
        [want("host/dir", None), want("host/dir/inner", Some("host")), want("host/victim", Some("host"))],
        "the dir beside the root changed"
    );
    let mut top: Vec<String> =
        std::fs::read_dir(scratch).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    top.sort();
    assert_eq!(top, ["host", "root"], "something was made beside the root");
});
