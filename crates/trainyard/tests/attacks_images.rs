//! Registry images, attacked the way a member who can push an image would: each test pushes a hostile image to
//! a real registry on 127.0.0.1 (Debian's `docker-registry`), runs it through a real `trainyard up` (root, the
//! local backend), and checks that nothing reached the host, that the server kept answering, and that the
//! legitimate path beside the attack still works.

mod common;

use common::*;
use serde_json::{Value, json};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use trainyard_images::testing::{
    GZIP_LAYER, Raw, TAR_LAYER, TestRegistry, debian_closure, gzip, host_layer, raw_layer,
};

/// [`CATALOG`] with images allowed from `host` over plain HTTP.
fn catalog_for(host: &str) -> String {
    let mut c: Value = serde_saphyr::from_str(CATALOG).unwrap();
    c["allowExternalImages"] = json!(true);
    c["registries"] = json!({ host: {"insecure": true} });
    serde_json::to_string(&c).unwrap()
}

fn serve(name: &str, reg: &TestRegistry, args: &[&str]) -> Server {
    let s = Server::start_with(
        name,
        Options { args: args.iter().map(|a| (*a).to_owned()).collect(), ..Options::default() },
    );
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog_for(&reg.host)));
    assert_eq!(status, 200, "{body}");
    s
}

/// bash and coreutils from this machine's packages: an image that runs.
fn base_layer() -> Vec<u8> {
    gzip(&host_layer(&debian_closure(&["bash", "coreutils"])))
}

fn on_image(prefix: &str, image: &str, cmd: &str) -> Value {
    let mut t = pytorch(prefix, 0, cmd);
    t["spec"]["environment"]["image"] = json!(image);
    t
}

/// A dir standing for the host's files, at a short path (link targets must fit a tar header): whatever an
/// image does, it must keep exactly what it held.
struct HostDir(PathBuf);

impl HostDir {
    fn new(name: &str) -> HostDir {
        let d = PathBuf::from(format!("/tmp/tyatk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("dir")).unwrap();
        std::fs::write(d.join("victim"), "host file").unwrap();
        std::fs::write(d.join("dir/inner"), "host file").unwrap();
        HostDir(d)
    }
    fn abs(&self) -> &str {
        self.0.to_str().unwrap()
    }
    fn untouched(&self) {
        let mut seen = Vec::new();
        walk(&self.0, &self.0, &mut seen);
        seen.sort();
        assert_eq!(seen, ["dir", "dir/inner", "victim"], "the host dir changed");
        for f in ["victim", "dir/inner"] {
            assert_eq!(std::fs::read_to_string(self.0.join(f)).unwrap(), "host file", "{f} was changed");
            assert_eq!(std::fs::metadata(self.0.join(f)).unwrap().uid(), 0);
        }
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn walk(top: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        out.push(e.path().strip_prefix(top).unwrap().display().to_string());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(top, &e.path(), out);
        }
    }
}

/// The cached root file systems of the server's image cache.
fn rootfs_dirs(s: &Server) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(s.dir.join("images/images")) else { return Vec::new() };
    rd.flatten().map(|e| e.path().join("rootfs")).filter(|p| p.is_dir()).collect()
}

#[test]
fn a_pulled_layer_cannot_write_or_remove_host_files_and_is_unpacked_without_root() {
    let host = HostDir::new("layer");
    let reg = TestRegistry::start("atk-layer", false, false);
    // Every way out the earlier unpacker missed, in one image, beside a file the task reads.
    let evil = raw_layer(&[
        // A hard link to a symlink, then written and whited out through.
        Raw::Sym("s", host.abs()),
        Raw::Hard("h", "s"),
        Raw::File("h/planted", b"1"),
        Raw::File("h/.wh.victim", b""),
        // A symlink made through another symlink.
        Raw::Dir("x"),
        Raw::Sym("d", "x"),
        Raw::Sym("d/evil", host.abs()),
        Raw::File("x/evil/planted2", b"2"),
        Raw::File("x/evil/.wh.dir", b""),
        // A hard link to a hard link to a symlink.
        Raw::Hard("h2", "h"),
        Raw::File("h2/planted3", b"3"),
        // A FIFO and a dir through the links.
        Raw::Fifo("h2/pipe"),
        Raw::Dir("h2/made"),
        Raw::Dir("app"),
        Raw::File("app/ok", b"the image's own file\n"),
    ]);
    // A later layer: an opaque marker through the chain, and whiteouts of the host dir's entries again.
    let evil2 = raw_layer(&[Raw::File("h/dir/.wh..wh..opq", b""), Raw::File("x/evil/.wh.victim", b"")]);
    reg.push("t/evil", "1", &[(GZIP_LAYER, base_layer()), (TAR_LAYER, evil), (TAR_LAYER, evil2)], json!({}));
    let s = serve("atk-layer", &reg, &[]);
    let id = s.submit(&on_image("evil", &format!("{}/t/evil:1", reg.host), "cat /app/ok"));
    let t = s.wait_status(&id, "Succeeded", secs(180));
    // The legitimate path: the image ran, its own file read.
    let log = s.log(&id, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    assert!(log.contains("the image's own file"), "{log}");
    host.untouched();
    // What the layer aimed at the host landed in the image's own root, owned by the unpacking uid.
    let roots = rootfs_dirs(&s);
    assert_eq!(roots.len(), 1, "{roots:?}");
    let inside = roots[0].join(host.abs().trim_start_matches('/'));
    for (f, text) in [("planted", "1"), ("planted2", "2"), ("planted3", "3")] {
        assert_eq!(std::fs::read_to_string(inside.join(f)).unwrap(), text, "{f}");
    }
    assert!(inside.join("made").is_dir());
    let m = std::fs::metadata(roots[0].join("app/ok")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1_899_999_999, 1_899_999_999), "unpacked as its own uid, not root");
}

/// An image whose `/etc/passwd` is `passwd` (one raw entry), on top of a runnable base.
fn push_passwd(reg: &TestRegistry, repo: &str, passwd: Raw) {
    let l = raw_layer(&[Raw::Dir("etc"), passwd]);
    reg.push(repo, "1", &[(GZIP_LAYER, base_layer()), (GZIP_LAYER, gzip(&l))], json!({}));
}

#[test]
fn an_image_passwd_cannot_freeze_the_server_leak_host_files_or_swell_its_memory() {
    let reg = TestRegistry::start("atk-passwd", false, false);
    let s = serve("atk-passwd", &reg, &[]);
    let token_path = s.dir.join("admin.token");
    let token_path = token_path.to_str().unwrap();
    push_passwd(&reg, "t/fifo", Raw::Fifo("etc/passwd"));
    push_passwd(&reg, "t/link", Raw::Sym("etc/passwd", token_path));
    let big = vec![b'x'; 2 << 20];
    push_passwd(&reg, "t/big", Raw::File("etc/passwd", &big));
    let img = |r: &str| format!("{}/{r}:1", reg.host);
    let fifo = s.submit(&on_image("fifo", &img("t/fifo"), "true"));
    let link = s.submit(&on_image("link", &img("t/link"), "cat /etc/passwd"));
    let big = s.submit(&on_image("big", &img("t/big"), "true"));
    // The server answers while (and after) it pulls them.
    for _ in 0..10 {
        let (status, _) = s.call("GET", "/healthz", None);
        assert_eq!(status, 200);
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    s.wait_status(&fifo, "Failed", secs(180));
    let ev = s.events_text(&fifo);
    assert!(ev.contains("ImagePullFailed") && ev.contains("/etc/passwd is not a regular file"), "{ev}");
    s.wait_status(&big, "Failed", secs(180));
    let ev = s.events_text(&big);
    assert!(ev.contains("/etc/passwd is 2097152 bytes, over the 1048576"), "{ev}");
    // The link to the admin token: resolved inside the image (where nothing is), never on the host.
    let t = s.wait_status(&link, "Succeeded", secs(180));
    let log = s.log(&link, &format!("{}-master-0", t["name"].as_str().unwrap()), None);
    assert!(!log.contains(&s.token), "the admin token reached the replica:\n{log}");
    let mut files = Vec::new();
    walk(&s.dir.join("runs"), &s.dir.join("runs"), &mut files);
    for f in files {
        let p = s.dir.join("runs").join(&f);
        if let Ok(text) = std::fs::read_to_string(&p) {
            assert!(!text.contains(&s.token), "the admin token was copied to {}", p.display());
        }
    }
    let (status, _) = s.call("GET", "/healthz", None);
    assert_eq!(status, 200);
}

#[test]
fn an_image_past_the_machines_bounds_fails_at_once_without_retrying() {
    let reg = TestRegistry::start("atk-bounds", false, false);
    // 3,000 empty files: past an admin's bound of 2,500 entries per image.
    let names: Vec<String> = (0..3000).map(|i| format!("many/f{i}")).collect();
    let mut entries = vec![Raw::Dir("many")];
    entries.extend(names.iter().map(|n| Raw::File(n, b"")));
    reg.push("t/many", "1", &[(GZIP_LAYER, gzip(&raw_layer(&entries)))], json!({}));
    reg.push("t/ok", "1", &[(GZIP_LAYER, base_layer())], json!({}));
    let s = serve("atk-bounds", &reg, &["--image-max-entries", "2500"]);
    let mut t = on_image("many", &format!("{}/t/many:1", reg.host), "true");
    // Even a task that would retry forever fails at once: another pull would be refused the same way.
    t["spec"]["advanced"] = json!({"imagePullTolerance": -1});
    let many = s.submit(&t);
    // The legitimate image beside it, under the same bounds.
    let ok = s.submit(&on_image("ok", &format!("{}/t/ok:1", reg.host), "echo fine"));
    s.wait_status(&many, "Failed", secs(180));
    let ev = s.events_text(&many);
    assert!(ev.contains("too-large") && ev.contains("more than 2500 entries"), "{ev}");
    assert!(!ev.contains("ImagePullBackOff"), "too-large is not retried:\n{ev}");
    s.wait_status(&ok, "Succeeded", secs(180));
    // Nothing of the refused image is left in the cache's work dir.
    let tmp = s.dir.join("images/tmp");
    assert_eq!(std::fs::read_dir(&tmp).map(|r| r.count()).unwrap_or(0), 0, "{}", tmp.display());
}

/// Issue 29, item 8: with external images allowed and no registry listed, an image address named any host,
/// and the server pulled from this machine and its networks on a member's behalf (127.0.0.1, the cloud's
/// metadata address). Such hosts are now refused before any request; listing the registry in the catalog
/// is the admin's allowance.
#[test]
fn an_image_address_cannot_reach_this_machine_unless_an_admin_lists_the_registry() {
    let reg = TestRegistry::start("atk-internal", false, false);
    reg.push("t/ok", "1", &[(GZIP_LAYER, base_layer())], json!({}));
    let s = Server::start("atk-internal", None);
    let mut c: Value = serde_saphyr::from_str(CATALOG).unwrap();
    c["allowExternalImages"] = json!(true);
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&serde_json::to_string(&c).unwrap()));
    assert_eq!(status, 200, "{body}");
    let before = reg.log().len();
    let local = s.submit(&on_image("local", &format!("{}/t/ok:1", reg.host), "echo ran"));
    let metadata = s.submit(&on_image("meta", "169.254.169.254/latest/meta-data:1", "echo ran"));
    for (id, what) in [(&local, "a loopback address"), (&metadata, "a link-local address")] {
        s.wait_status(id, "Failed", secs(60));
        let ev = s.events_text(id);
        assert!(ev.contains(what) && ev.contains("lists them in the catalog's registries"), "{ev}");
    }
    assert_eq!(reg.log().len(), before, "the registry on this machine was asked:\n{}", reg.log());
    // The admin lists the registry: the same image runs.
    let (status, body) = s.call("PUT", "/api/v1/admin/catalog", Some(&catalog_for(&reg.host)));
    assert_eq!(status, 200, "{body}");
    let listed = s.submit(&on_image("listed", &format!("{}/t/ok:1", reg.host), "echo ran"));
    s.wait_status(&listed, "Succeeded", secs(120));
    assert!(reg.log().len() > before, "the registry's log shows requests (so its silence above means none)");
}
