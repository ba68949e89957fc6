use super::*;
use std::os::unix::fs::MetadataExt;

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
    let mut u = Unpacker::new(&known);
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
