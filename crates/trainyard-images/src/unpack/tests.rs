use super::layer::DISK_CHECK_ENTRIES;
use super::*;
use rustix::fs::{FileType, Mode, OFlags};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A scratch dir of this test's own, removed when dropped.
pub(crate) struct Scratch(pub PathBuf);
impl Scratch {
    pub(crate) fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("ty-images-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}
impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a str, u32, u64),
    Link(&'a str, &'a str),
    Sym(&'a str, &'a str),
}

/// A tar of `entries`, names written raw (a layer may carry `..` and absolute links; tar's builder refuses to
/// write such names, so the header fields are set directly, as a hostile layer's would be).
fn layer(entries: &[E]) -> Vec<u8> {
    fn raw(h: &mut tar::Header, path: &str, link: Option<&str>) {
        let old = h.as_old_mut();
        old.name = [0; 100];
        old.name[..path.len()].copy_from_slice(path.as_bytes());
        if let Some(l) = link {
            old.linkname = [0; 100];
            old.linkname[..l.len()].copy_from_slice(l.as_bytes());
        }
        h.set_cksum();
    }
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        let (path, link, data): (&str, Option<&str>, &[u8]) = match e {
            E::Dir(p) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                (p, None, b"")
            }
            E::File(p, text, mode, uid) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_uid(*uid);
                (p, None, text.as_bytes())
            }
            E::Link(p, to) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                (p, Some(*to), b"")
            }
            E::Sym(p, to) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                (p, Some(*to), b"")
            }
        };
        h.set_size(data.len() as u64);
        raw(&mut h, path, link);
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

fn gz(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut e, bytes).unwrap();
    e.finish().unwrap()
}

fn read(root: &Path, p: &str) -> Option<String> {
    std::fs::read_to_string(root.join(p)).ok()
}

#[test]
fn whiteouts_remove_and_opaque_dirs_keep_only_their_own_layer() {
    let s = Scratch::new("wh");
    let root = s.0.join("root");
    std::fs::create_dir(&root).unwrap();
    let l1 = layer(&[
        E::Dir("a"),
        E::File("a/x", "x", 0o644, 0),
        E::File("a/y", "y", 0o644, 0),
        E::Dir("b"),
        E::File("b/old", "old", 0o644, 0),
        E::Dir("b/sub"),
        E::File("b/sub/deep", "deep", 0o644, 0),
        E::Dir("gone"),
        E::File("gone/f", "f", 0o644, 0),
    ]);
    apply_layer(&root, &l1[..]).unwrap();
    let l2 = layer(&[
        E::File("a/.wh.x", "", 0o644, 0),
        E::File(".wh.gone", "", 0o644, 0),
        E::Dir("b"),
        E::File("b/new", "new", 0o644, 0),
        E::File("b/.wh..wh..opq", "", 0o644, 0),
    ]);
    // Compressed this time: both forms are layers.
    apply_layer(&root, &gz(&l2)[..]).unwrap();
    assert_eq!(read(&root, "a/x"), None);
    assert_eq!(read(&root, "a/y").as_deref(), Some("y"));
    assert!(!root.join("gone").exists());
    assert_eq!(read(&root, "b/new").as_deref(), Some("new"), "this layer's entry survives its opaque marker");
    assert_eq!(read(&root, "b/old"), None);
    assert!(!root.join("b/sub").exists());
    assert!(!root.join("a/.wh.x").exists() && !root.join("b/.wh..wh..opq").exists());
}

#[test]
fn hard_links_share_an_inode_within_and_across_layers() {
    let s = Scratch::new("hl");
    let root = s.0.join("root");
    std::fs::create_dir(&root).unwrap();
    apply_layer(
        &root,
        &layer(&[E::Dir("usr"), E::File("usr/a", "data", 0o755, 0), E::Link("usr/b", "usr/a")])[..],
    )
    .unwrap();
    apply_layer(&root, &layer(&[E::Link("c", "./usr/a")])[..]).unwrap();
    let ino = |p: &str| std::fs::metadata(root.join(p)).unwrap().ino();
    assert_eq!(ino("usr/a"), ino("usr/b"));
    assert_eq!(ino("usr/a"), ino("c"));
    assert_eq!(std::fs::metadata(root.join("c")).unwrap().nlink(), 3);
    let err = apply_layer(&root, &layer(&[E::Link("d", "nowhere")])[..]).unwrap_err();
    assert!(err.contains("which the layers do not have"), "{err}");
}

#[test]
fn symlinks_never_lead_a_layer_out_of_its_root() {
    let s = Scratch::new("esc");
    let root = s.0.join("root");
    let outside = s.0.join("outside");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    // Links that would point out of the root if followed on the host: absolute, and climbing.
    apply_layer(
        &root,
        &layer(&[
            E::Sym("abs", outside.to_str().unwrap()),
            E::Sym("up", "../../../../../../../../outside"),
            E::Sym("loop", "loop"),
        ])[..],
    )
    .unwrap();
    apply_layer(
        &root,
        &layer(&[
            E::File("abs/planted", "x", 0o644, 0),
            E::File("up/planted", "y", 0o644, 0),
            E::File("../../../../outside/dotdot", "z", 0o644, 0),
            E::Link("stolen", "../../../../etc/hostname"),
        ])[..],
    )
    .unwrap_err();
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing was written outside the root");
    // Inside the root, the absolute link's target and the climbing one's end where `/` would.
    let inside = outside.strip_prefix("/").unwrap();
    assert_eq!(read(&root, &format!("{}/planted", inside.display())).as_deref(), Some("x"));
    assert_eq!(read(&root, "outside/planted").as_deref(), Some("y"));
    assert_eq!(read(&root, "outside/dotdot").as_deref(), Some("z"));
    let err = apply_layer(&root, &layer(&[E::File("loop/x", "", 0o644, 0)])[..]).unwrap_err();
    assert!(err.contains("too many levels of symlinks"), "{err}");
}

#[test]
fn modes_drop_set_id_bits_and_share_an_image_users_files() {
    let s = Scratch::new("mode");
    let root = s.0.join("root");
    std::fs::create_dir(&root).unwrap();
    apply_layer(
        &root,
        &layer(&[
            E::File("suid", "x", 0o4755, 0),
            E::File("secret", "x", 0o600, 0),
            E::File("mine", "x", 0o700, 1000),
        ])[..],
    )
    .unwrap();
    let mode = |p: &str| std::fs::metadata(root.join(p)).unwrap().mode() & 0o7777;
    assert_eq!(mode("suid"), 0o755);
    assert_eq!(mode("secret"), 0o600, "root's private files stay private");
    assert_eq!(mode("mine"), 0o705);
    // Dirs no entry names are made passable, whatever the server's umask.
    apply_layer(&root, &layer(&[E::File("implied/deeper/f", "x", 0o644, 0)])[..]).unwrap();
    assert_eq!(mode("implied"), 0o755);
    assert_eq!(mode("implied/deeper"), 0o755);
    assert_eq!(std::fs::metadata(root.join("mine")).unwrap().mtime(), 1_700_000_000);
}

#[test]
fn a_file_replaces_a_directory_and_the_other_way_round() {
    let s = Scratch::new("repl");
    let root = s.0.join("root");
    std::fs::create_dir(&root).unwrap();
    apply_layer(
        &root,
        &layer(&[E::Dir("d"), E::File("d/f", "1", 0o644, 0), E::File("f", "2", 0o644, 0)])[..],
    )
    .unwrap();
    apply_layer(&root, &layer(&[E::File("d", "now a file", 0o644, 0), E::Dir("f")])[..]).unwrap();
    assert_eq!(read(&root, "d").as_deref(), Some("now a file"));
    assert!(root.join("f").is_dir());
}

#[test]
fn garbage_is_an_error_not_a_panic() {
    let s = Scratch::new("junk");
    let root = s.0.join("root");
    std::fs::create_dir(&root).unwrap();
    let mut junk = vec![0x1f, 0x8b];
    junk.extend_from_slice(&[7u8; 600]);
    assert!(apply_layer(&root, &junk[..]).is_err());
    let zstd = [0x28, 0xb5, 0x2f, 0xfd, 0, 0];
    assert!(apply_layer(&root, &zstd[..]).unwrap_err().contains("zstd"));
}

#[test]
fn an_unpacker_that_knows_its_links_resolves_the_same_and_stays_inside() {
    let s = Scratch::new("unp");
    let outside = s.0.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let layers = [
        layer(&[
            E::Dir("usr"),
            E::Dir("usr/bin"),
            E::Sym("bin", "usr/bin"),
            E::Sym("abs", outside.to_str().unwrap()),
            E::Sym("up", "../../../../../../../../outside"),
        ]),
        layer(&[
            E::File("bin/bash", "#!", 0o755, 0),
            E::File("abs/planted", "x", 0o644, 0),
            E::File("up/planted", "y", 0o644, 0),
            E::Link("bin/sh", "bin/bash"),
        ]),
        // A dir replaced by a link in a later layer, then written through.
        layer(&[E::Dir("opt"), E::Dir("real")]),
        layer(&[E::Sym("opt", "/real"), E::File("opt/f", "through", 0o644, 0)]),
    ];
    let known = s.0.join("known");
    std::fs::create_dir(&known).unwrap();
    let mut u = Unpacker::new(&known, Limits::default()).unwrap();
    for l in &layers {
        u.apply(&l[..]).unwrap();
    }
    let walked = s.0.join("walked");
    std::fs::create_dir(&walked).unwrap();
    for l in &layers {
        apply_layer(&walked, &l[..]).unwrap();
    }
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0, "nothing was written outside the root");
    for root in [&known, &walked] {
        assert_eq!(read(root, "usr/bin/bash").as_deref(), Some("#!"));
        assert_eq!(read(root, "usr/bin/sh").as_deref(), Some("#!"));
        assert_eq!(read(root, "outside/planted").as_deref(), Some("y"));
        assert_eq!(read(root, "real/f").as_deref(), Some("through"));
        let inside = outside.strip_prefix("/").unwrap();
        assert_eq!(read(root, &format!("{}/planted", inside.display())).as_deref(), Some("x"));
    }
}

/// A root and a dir beside it that stands for the host: whatever a layer does, the host dir must keep exactly
/// what it held.
struct Host {
    _s: Scratch,
    root: PathBuf,
    outside: PathBuf,
}

impl Host {
    fn new(name: &str) -> Host {
        let s = Scratch::new(name);
        let root = s.0.join("root");
        let outside = s.0.join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(outside.join("dir")).unwrap();
        std::fs::write(outside.join("victim"), "host file").unwrap();
        std::fs::write(outside.join("dir/inner"), "host file").unwrap();
        Host { _s: s, root, outside }
    }
    fn abs(&self) -> &str {
        self.outside.to_str().unwrap()
    }
    /// The host dir holds what it held, nothing more, nothing less.
    fn untouched(&self) {
        let mut seen = Vec::new();
        let mut todo = vec![self.outside.clone()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                seen.push(p.strip_prefix(&self.outside).unwrap().display().to_string());
                if e.file_type().unwrap().is_dir() {
                    todo.push(p);
                }
            }
        }
        seen.sort();
        assert_eq!(seen, ["dir", "dir/inner", "victim"], "the host dir changed");
        assert_eq!(std::fs::read_to_string(self.outside.join("victim")).unwrap(), "host file");
        assert_eq!(std::fs::read_to_string(self.outside.join("dir/inner")).unwrap(), "host file");
    }
    /// Where the host dir's path lands inside the root.
    fn inside(&self, rest: &str) -> PathBuf {
        self.root.join(self.outside.strip_prefix("/").unwrap()).join(rest)
    }
    /// Applies the layers in one unpacker, then each on its own onto a fresh root: both must hold.
    fn apply_all(&self, layers: &[Vec<u8>]) -> Vec<Result<Applied, String>> {
        let mut u = Unpacker::new(&self.root, Limits::default()).unwrap();
        layers.iter().map(|l| u.apply(&l[..])).collect()
    }
}

#[test]
fn a_hard_link_to_a_symlink_is_walked_on_disk_not_remembered() {
    let h = Host::new("hl-sym");
    // `s -> /HOST`, `h` a hard link to `s` (so `h` is that symlink too), then `h/planted`.
    let got = h.apply_all(&[
        layer(&[E::Sym("s", h.abs()), E::Link("h", "s"), E::File("h/planted", "x", 0o644, 0)]),
        layer(&[E::File("h/again", "y", 0o644, 0), E::File("h/.wh.victim", "", 0o644, 0)]),
    ]);
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    h.untouched();
    assert_eq!(
        std::fs::read_to_string(h.inside("planted")).unwrap(),
        "x",
        "written where `/HOST` is in the root"
    );
    assert_eq!(std::fs::read_to_string(h.inside("again")).unwrap(), "y");
}

#[test]
fn a_symlink_made_through_a_symlink_stays_inside() {
    let h = Host::new("sym-sym");
    // `d -> x`, then `d/evil -> /HOST` (really `x/evil`), then `x/evil/planted`.
    let got = h.apply_all(&[
        layer(&[E::Dir("x"), E::Sym("d", "x"), E::Sym("d/evil", h.abs())]),
        layer(&[E::File("x/evil/planted", "x", 0o644, 0), E::File("x/evil/dir/.wh.inner", "", 0o644, 0)]),
        layer(&[E::Dir("x/evil/made"), E::Link("x/evil/linked", "x/evil/planted")]),
    ]);
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    h.untouched();
    assert!(std::fs::symlink_metadata(h.root.join("x/evil")).unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(h.inside("planted")).unwrap(), "x");
    assert_eq!(std::fs::read_to_string(h.inside("linked")).unwrap(), "x");
    assert!(h.inside("made").is_dir());
}

#[test]
fn chains_of_links_and_links_to_links_stay_inside() {
    let h = Host::new("chains");
    let got = h.apply_all(&[
        layer(&[
            E::Sym("c", h.abs()),
            E::Sym("b", "c"),
            E::Sym("a", "./b"),
            // A hard link to a hard link to a symlink.
            E::Sym("s", h.abs()),
            E::Link("h1", "s"),
            E::Link("h2", "h1"),
            // Relative links that climb past the root.
            E::Sym("up", "../../../../../../.."),
        ]),
        layer(&[
            E::File("a/via-chain", "1", 0o644, 0),
            E::File("h2/via-links", "2", 0o644, 0),
            E::File(&format!("up{}/via-climb", h.abs()), "3", 0o644, 0),
            E::File("a/.wh.victim", "", 0o644, 0),
            E::File("h2/dir/.wh..wh..opq", "", 0o644, 0),
        ]),
    ]);
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    h.untouched();
    for (f, text) in [("via-chain", "1"), ("via-links", "2"), ("via-climb", "3")] {
        assert_eq!(std::fs::read_to_string(h.inside(f)).unwrap(), text, "{f}");
    }
}

#[test]
fn whiteouts_and_opaque_markers_under_links_remove_nothing_outside() {
    let h = Host::new("wh-links");
    // Each on its own layer set, so one's failure cannot hide another's.
    for (i, l) in [
        vec![layer(&[E::Sym("s", h.abs())]), layer(&[E::File("s/.wh.victim", "", 0o644, 0)])],
        vec![layer(&[E::Sym("s", h.abs())]), layer(&[E::File("s/.wh.dir", "", 0o644, 0)])],
        vec![
            layer(&[E::Sym("s", h.abs()), E::Link("h", "s")]),
            layer(&[E::File("h/.wh..wh..opq", "", 0o644, 0)]),
        ],
        vec![
            layer(&[E::Sym("s", &format!("{}/dir", h.abs()))]),
            layer(&[E::File("s/.wh..wh..opq", "", 0o644, 0)]),
        ],
        // A whiteout naming `..` or `.`: nothing to remove.
        vec![
            layer(&[E::Dir("d")]),
            layer(&[E::File("d/.wh...", "", 0o644, 0), E::File("d/.wh..", "", 0o644, 0)]),
        ],
    ]
    .iter()
    .enumerate()
    {
        let got = h.apply_all(l);
        assert!(got.iter().all(Result::is_ok), "case {i}: {got:?}");
        h.untouched();
    }
    // Inside the root the same whiteouts do their work.
    std::fs::create_dir_all(h.inside("dir")).unwrap();
    std::fs::write(h.inside("victim"), "in the root").unwrap();
    std::fs::write(h.inside("dir/inner"), "in the root").unwrap();
    let got = h.apply_all(&[layer(&[
        E::Sym("t", h.abs()),
        E::File("t/.wh.victim", "", 0o644, 0),
        E::File("t/dir/.wh..wh..opq", "", 0o644, 0),
    ])]);
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    assert!(!h.inside("victim").exists() && !h.inside("dir/inner").exists() && h.inside("dir").is_dir());
    h.untouched();
}

#[test]
fn a_hard_link_never_reaches_a_host_file() {
    let h = Host::new("hl-host");
    let victim = format!("{}/victim", h.abs());
    let got = h.apply_all(&[
        layer(&[E::Sym("s", h.abs())]),
        layer(&[E::Link("stolen", "s/victim")]),
        layer(&[E::Link("stolen2", &victim)]),
    ]);
    assert!(got[0].is_ok() && got[1].is_err() && got[2].is_err(), "{got:?}");
    assert!(got[1].as_ref().unwrap_err().contains("which the layers do not have"), "{got:?}");
    assert!(!h.root.join("stolen").exists() && !h.root.join("stolen2").exists());
    assert_eq!(std::fs::metadata(h.outside.join("victim")).unwrap().nlink(), 1, "no link to the host file");
    h.untouched();
}

#[test]
fn fifos_and_dirs_through_links_land_inside() {
    let h = Host::new("fifo-dir");
    let mut fifo = layer(&[E::Sym("s", h.abs())]);
    // A FIFO entry under the link (tar's builder makes it; the name is plain).
    let mut b = tar::Builder::new(Vec::new());
    let mut hd = tar::Header::new_gnu();
    hd.set_entry_type(tar::EntryType::Fifo);
    hd.set_mode(0o644);
    hd.set_size(0);
    b.append_data(&mut hd, "s/pipe", &[][..]).unwrap();
    fifo = [fifo, b.into_inner().unwrap()].concat();
    let got = h.apply_all(&[fifo, layer(&[E::Dir("s/newdir")])]);
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    h.untouched();
    assert!(h.inside("newdir").is_dir());
}

#[test]
fn limits_stop_a_layer_at_once() {
    let s = Scratch::new("limits");
    let root = s.0.join("root");
    std::fs::create_dir(&root).unwrap();
    let limits = Limits {
        layer_bytes: 100,
        layer_entries: 5,
        image_bytes: 150,
        image_entries: 8,
        ..Limits::unbounded()
    };
    let big = "x".repeat(101);
    let mut u = Unpacker::new(&root, limits).unwrap();
    let err = u.apply(&layer(&[E::File("big", &big, 0o644, 0)])[..]).unwrap_err();
    assert!(err.starts_with(TOO_LARGE) && err.contains("100 bytes"), "{err}");
    assert!(!root.join("big").exists(), "refused by its header, before a byte was written");
    let many: Vec<String> = (0..6).map(|i| format!("f{i}")).collect();
    let entries: Vec<E> = many.iter().map(|n| E::File(n, "", 0o644, 0)).collect();
    let err = u.apply(&layer(&entries)[..]).unwrap_err();
    assert!(err.starts_with(TOO_LARGE) && err.contains("entries"), "{err}");
    // Two files of one layer within the image's bound: each byte counted once.
    let mut u = Unpacker::new(&root, Limits { image_bytes: 100, ..Limits::unbounded() }).unwrap();
    let forty = "z".repeat(40);
    u.apply(&layer(&[E::File("p", &forty, 0o644, 0), E::File("q", &forty, 0o644, 0)])[..]).unwrap();
    assert_eq!(u.total(), Applied { bytes: 80, entries: 2 });
    // Within a layer's bounds, but past the image's.
    let mut u = Unpacker::new(&root, limits).unwrap();
    let eighty = "y".repeat(80);
    u.apply(&layer(&[E::File("a", &eighty, 0o644, 0)])[..]).unwrap();
    let err = u.apply(&layer(&[E::File("b", &eighty, 0o644, 0)])[..]).unwrap_err();
    assert!(err.starts_with(TOO_LARGE) && err.contains("image"), "{err}");
    // The disk's reserve: a file system never has u64::MAX bytes free.
    let mut u = Unpacker::new(&root, Limits { reserve_bytes: u64::MAX, ..Limits::unbounded() }).unwrap();
    let files: Vec<String> = (0..DISK_CHECK_ENTRIES).map(|i| format!("n{i}")).collect();
    let entries: Vec<E> = files.iter().map(|n| E::File(n, "", 0o644, 0)).collect();
    let err = u.apply(&layer(&entries)[..]).unwrap_err();
    assert!(err.starts_with(NO_SPACE), "{err}");
}

#[test]
fn an_image_file_is_read_inside_its_root_without_blocking() {
    let h = Host::new("read-in-root");
    let etc = h.root.join("etc");
    std::fs::create_dir(&etc).unwrap();
    std::fs::write(etc.join("passwd"), "root:x:0:0::/root:/bin/bash\n").unwrap();
    assert_eq!(
        read_in_root(&h.root, "etc/passwd", 1 << 20).unwrap().unwrap(),
        b"root:x:0:0::/root:/bin/bash\n"
    );
    assert_eq!(read_in_root(&h.root, "etc/group", 1 << 20).unwrap(), None);
    // A FIFO: refused at once (opened without blocking, then its type checked).
    std::fs::remove_file(etc.join("passwd")).unwrap();
    rustix::fs::mknodat(rustix::fs::CWD, etc.join("passwd"), FileType::Fifo, Mode::from_raw_mode(0o644), 0)
        .unwrap();
    let err = read_in_root(&h.root, "etc/passwd", 1 << 20).unwrap_err();
    assert!(err.contains("not a regular file"), "{err}");
    // A link to a host file: followed inside the root only.
    std::fs::remove_file(etc.join("passwd")).unwrap();
    std::os::unix::fs::symlink(format!("{}/victim", h.abs()), etc.join("passwd")).unwrap();
    assert_eq!(read_in_root(&h.root, "etc/passwd", 1 << 20).unwrap(), None, "the host file is not read");
    std::fs::create_dir_all(h.inside("")).unwrap();
    std::fs::write(h.inside("victim"), "the image's own").unwrap();
    assert_eq!(read_in_root(&h.root, "etc/passwd", 1 << 20).unwrap().unwrap(), b"the image's own");
    std::fs::remove_file(etc.join("passwd")).unwrap();
    std::os::unix::fs::symlink(
        "../../../../../../../../../../../..".to_owned() + h.abs() + "/victim",
        etc.join("passwd"),
    )
    .unwrap();
    assert_eq!(read_in_root(&h.root, "etc/passwd", 1 << 20).unwrap().unwrap(), b"the image's own");
    // Too large: refused by its size.
    std::fs::remove_file(etc.join("passwd")).unwrap();
    std::fs::write(etc.join("passwd"), vec![b'x'; 2000]).unwrap();
    let err = read_in_root(&h.root, "etc/passwd", 1000).unwrap_err();
    assert!(err.contains("over the 1000"), "{err}");
    assert!(is_file_in_root(&h.root, "etc/passwd") && !is_file_in_root(&h.root, "etc"));
    h.untouched();
}

#[test]
fn the_unpacking_thread_runs_as_the_unprivileged_id() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: switching uids needs root");
        return;
    }
    const ID: u32 = 1_899_999_990;
    let s = Scratch::new("as-id");
    let root = s.0.join("root");
    std::fs::create_dir(&root).unwrap();
    rustix::fs::chown(&root, Some(rustix::fs::Uid::from_raw(ID)), Some(rustix::fs::Gid::from_raw(ID)))
        .unwrap();
    // A dir only root may write: the thread cannot, whatever path it is given.
    let guarded = s.0.join("guarded");
    std::fs::create_dir(&guarded).unwrap();
    let fd =
        rustix::fs::open(&root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).unwrap();
    let (ids, wrote, applied) = unprivileged(Some(ID), || {
        let ids = (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw());
        let wrote = std::fs::write(guarded.join("x"), "x").is_ok();
        let mut u = Unpacker::at(fd, Limits::default());
        let applied = u.apply(&gz(&layer(&[E::Dir("d"), E::File("d/f", "in", 0o600, 0)]))[..]);
        (ids, wrote, applied)
    })
    .unwrap();
    assert_eq!(ids, (ID, ID));
    assert!(!wrote, "an unprivileged thread wrote into a root-only dir");
    applied.unwrap();
    let m = std::fs::metadata(root.join("d/f")).unwrap();
    assert_eq!((m.uid(), m.gid()), (ID, ID), "the image's files are the unpacking uid's");
    assert!(rustix::process::geteuid().is_root(), "the rest of the process is still root");
    assert!(std::fs::write(guarded.join("y"), "y").is_ok());
}
