//! The image cache against a real registry on 127.0.0.1 (Debian's `docker-registry`, the CNCF distribution
//! registry), with images these tests build and push themselves.

use std::collections::BTreeSet;
use std::path::PathBuf;
use trainyard_images::testing::{FlakyProxy, GZIP_LAYER, TAR_LAYER, TestRegistry, files_layer, gzip};
use trainyard_images::{Access, FailureClass, Images, Look};

struct Cache {
    images: Images,
    dir: PathBuf,
}

impl Cache {
    fn new(name: &str) -> Cache {
        let dir = std::env::temp_dir().join(format!("ty-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        Cache { images: Images::open(&dir, None).unwrap(), dir }
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Waits for the pull of `reference` with `access` to end.
fn wait(images: &Images, reference: &str, access: &Access) -> Look {
    let t0 = std::time::Instant::now();
    loop {
        match images.look(reference, access) {
            Look::Pulling { .. } | Look::Unknown => {}
            done => return done,
        }
        assert!(t0.elapsed().as_secs() < 120, "the pull of {reference} did not end");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn pull(c: &Cache, reg: &TestRegistry, reference: &str) -> Look {
    c.images.start(reference, &reg.access());
    wait(&c.images, reference, &reg.access())
}

const BASH: &[u8] = b"#!/fake bash, enough for the cache's check\n";

fn base_layer() -> Vec<u8> {
    files_layer(&[("usr/bin/bash", BASH, 0o755), ("etc/os-release", b"ID=test\n", 0o644)])
}

fn sha(b: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{:x}", sha2::Sha256::digest(b))
}

#[test]
fn pulls_by_tag_and_digest_over_tls_with_basic_auth_and_never_fetches_a_layer_twice() {
    let reg = TestRegistry::start("tls-auth", true, true);
    let base = gzip(&base_layer());
    let app = files_layer(&[("app/train.py", b"print('hi')\n", 0o644)]);
    let digest = reg.push(
        "team/pytorch",
        "2.3",
        &[(GZIP_LAYER, base.clone()), (TAR_LAYER, app.clone())],
        serde_json::json!({"Env": ["PATH=/usr/bin", "LANG=C.UTF-8"], "WorkingDir": "/app", "User": "1000:1000"}),
    );
    let c = Cache::new("tls-auth");
    let by_tag = format!("{}/team/pytorch:2.3", reg.host);
    let Look::Ready(img) = pull(&c, &reg, &by_tag) else {
        panic!("{:?}", c.images.look(&by_tag, &reg.access()))
    };
    assert_eq!(img.digest, digest);
    assert_eq!(img.pinned(), format!("{}/team/pytorch:2.3@{digest}", reg.host));
    assert_eq!(std::fs::read(img.rootfs.join("usr/bin/bash")).unwrap(), BASH);
    assert_eq!(std::fs::read_to_string(img.rootfs.join("app/train.py")).unwrap(), "print('hi')\n");
    assert_eq!(img.config.env, ["PATH=/usr/bin", "LANG=C.UTF-8"]);
    assert_eq!(img.config.working_dir.as_deref(), Some("/app"));
    assert_eq!(img.config.user.as_deref(), Some("1000:1000"));

    // By digest: the same image, from the cache.
    let by_digest = format!("{}/team/pytorch@{digest}", reg.host);
    let Look::Ready(again) = pull(&c, &reg, &by_digest) else { panic!() };
    assert_eq!(again.rootfs, img.rootfs);
    // Another image on the same base: only its own layer comes.
    let extra = files_layer(&[("app/eval.py", b"print('eval')\n", 0o644)]);
    reg.push(
        "team/eval",
        "1",
        &[(GZIP_LAYER, base.clone()), (TAR_LAYER, extra.clone())],
        serde_json::json!({}),
    );
    let Look::Ready(_) = pull(&c, &reg, &format!("{}/team/eval:1", reg.host)) else { panic!() };
    assert_eq!(reg.blob_gets(&sha(&base)), 1, "the shared base layer was fetched once:\n{}", reg.log());
    assert_eq!(reg.blob_gets(&sha(&app)), 1);
    assert_eq!(reg.blob_gets(&sha(&extra)), 1);
    assert_eq!(c.images.cached().len(), 2);
}

#[test]
fn pulls_of_one_image_at_once_share_one_download() {
    let reg = TestRegistry::start("dedupe", false, false);
    let big: Vec<u8> = (0..8u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let layer = files_layer(&[("usr/bin/bash", BASH, 0o755), ("data.bin", &big, 0o644)]);
    reg.push("big", "v1", &[(TAR_LAYER, layer.clone())], serde_json::json!({}));
    let c = Cache::new("dedupe");
    let r = format!("{}/big:v1", reg.host);
    // Two tasks ask for it at once: the second joins the first's pull.
    c.images.start(&r, &reg.access());
    assert!(matches!(c.images.look(&r, &reg.access()), Look::Pulling { .. }));
    c.images.start(&r, &reg.access());
    assert!(matches!(wait(&c.images, &r, &reg.access()), Look::Ready(_)));
    assert_eq!(reg.blob_gets(&sha(&layer)), 1, "{}", reg.log());
}

#[test]
fn failures_are_classified_for_the_user() {
    let reg = TestRegistry::start("fail", true, true);
    reg.push("team/x", "1", &[(GZIP_LAYER, gzip(&base_layer()))], serde_json::json!({}));
    let c = Cache::new("fail");
    let r = format!("{}/team/x:1", reg.host);

    let mut no_creds = reg.access();
    no_creds.credentials.clear();
    c.images.start(&r, &no_creds);
    let Look::Failed(e) = wait(&c.images, &r, &no_creds) else { panic!() };
    assert_eq!(e.class, FailureClass::Unauthorized, "{e}");
    assert!(e.message.contains("credentials"), "{e}");

    let mut no_ca = reg.access();
    no_ca.registries.values_mut().for_each(|x| x.ca_bundle = None);
    c.images.start(&r, &no_ca);
    let Look::Failed(e) = wait(&c.images, &r, &no_ca) else { panic!() };
    assert_eq!(e.class, FailureClass::Unreachable, "an unknown CA: {e}");

    let missing = format!("{}/team/x:2", reg.host);
    let Look::Failed(e) = pull(&c, &reg, &missing) else { panic!() };
    assert_eq!(e.class, FailureClass::NotFound, "{e}");
    assert!(!e.class.retryable());

    let down = "127.0.0.1:9/team/x:1";
    let mut a = reg.access();
    a.registries.insert("127.0.0.1:9".into(), Default::default());
    c.images.start(down, &a);
    let Look::Failed(e) = wait(&c.images, down, &a) else { panic!() };
    assert_eq!(e.class, FailureClass::Unreachable, "{e}");
    assert!(e.class.retryable());

    // An image without bash cannot run a task's command.
    reg.push(
        "team/nobash",
        "1",
        &[(TAR_LAYER, files_layer(&[("etc/hostname", b"x\n", 0o644)]))],
        serde_json::json!({}),
    );
    let Look::Failed(e) = pull(&c, &reg, &format!("{}/team/nobash:1", reg.host)) else { panic!() };
    assert_eq!(e.class, FailureClass::Invalid);
    assert!(e.message.contains("has no bash"), "{e}");
}

/// A pull answers only requests with its credentials: one without them (or with other ones) asks the registry
/// itself, whether the pull is under way or finished a moment ago, and the cache on disk hands the image out
/// only after the registry gave that access the manifest.
#[test]
fn a_pull_made_with_a_login_answers_no_request_without_it() {
    let reg = TestRegistry::start("access", true, true);
    let big: Vec<u8> = (0..4u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let layer = files_layer(&[("usr/bin/bash", BASH, 0o755), ("data.bin", &big, 0o644)]);
    reg.push("private/x", "1", &[(TAR_LAYER, layer.clone())], serde_json::json!({}));
    let c = Cache::new("access");
    let r = format!("{}/private/x:1", reg.host);
    let login = reg.access();
    let mut anonymous = reg.access();
    anonymous.credentials.clear();
    let mut wrong = reg.access();
    wrong.credentials.values_mut().for_each(|x| x.password = "not-the-password".into());
    // Under way with the login: a request without it does not join.
    c.images.start(&r, &login);
    c.images.start(&r, &anonymous);
    let Look::Failed(e) = wait(&c.images, &r, &anonymous) else { panic!() };
    assert_eq!(e.class, FailureClass::Unauthorized, "{e}");
    assert!(matches!(wait(&c.images, &r, &login), Look::Ready(_)));
    // Finished a moment ago (within READY_FOR): the login's requests are answered from memory, the others
    // ask the registry, which refuses them although the image is in the cache.
    c.images.start(&r, &login);
    assert!(matches!(c.images.look(&r, &login), Look::Ready(_)), "answered from memory");
    for other in [&anonymous, &wrong] {
        c.images.start(&r, other);
        let Look::Failed(e) = wait(&c.images, &r, other) else { panic!("{:?}", c.images.look(&r, other)) };
        assert_eq!(e.class, FailureClass::Unauthorized, "{e}");
    }
    assert_eq!(c.images.cached().len(), 1, "the image is in the cache all along");
    assert_eq!(reg.blob_gets(&sha(&layer)), 1, "{}", reg.log());
}

#[test]
fn a_tampered_layer_is_refused_and_leaves_nothing_behind() {
    let reg = TestRegistry::start("tamper", false, false);
    let layer = files_layer(&[("usr/bin/bash", BASH, 0o755), ("model.bin", &[7u8; 4096], 0o644)]);
    reg.push("m", "1", &[(TAR_LAYER, layer.clone())], serde_json::json!({}));
    // The registry's copy changes under it: same length, other bytes.
    let f = reg.blob_file(&sha(&layer));
    let mut bytes = std::fs::read(&f).unwrap();
    let n = bytes.len();
    bytes[n - 1500] ^= 0xff;
    std::fs::write(&f, bytes).unwrap();
    let c = Cache::new("tamper");
    let Look::Failed(e) = pull(&c, &reg, &format!("{}/m:1", reg.host)) else { panic!() };
    assert_eq!(e.class, FailureClass::DigestMismatch, "{e}");
    assert!(c.images.store().blobs().is_empty(), "no unverified blob is kept");
    assert!(c.images.cached().is_empty());
    assert_eq!(std::fs::read_dir(c.images.store().tmp_dir()).unwrap().count(), 0);
}

#[test]
fn a_registry_that_fails_the_first_pulls_is_pulled_from_once_it_answers() {
    let reg = TestRegistry::start("flaky", false, false);
    reg.push("f", "1", &[(TAR_LAYER, base_layer())], serde_json::json!({}));
    let proxy = FlakyProxy::start(&reg.host, 2);
    let c = Cache::new("flaky");
    let r = format!("{}/f:1", proxy.host);
    let mut access = reg.access();
    access.registries.insert(
        proxy.host.clone(),
        trainyard_core::catalog::Registry { insecure: true, ..Default::default() },
    );
    let mut tries = 0;
    let img = loop {
        tries += 1;
        c.images.start(&r, &access);
        match wait(&c.images, &r, &access) {
            Look::Ready(img) => break img,
            Look::Failed(e) => assert_eq!(e.class, FailureClass::Unreachable, "{e}"),
            other => panic!("{other:?}"),
        }
        assert!(tries < 10);
    };
    assert!(tries >= 2, "the first pulls failed");
    assert!(img.rootfs.join("usr/bin/bash").is_file());
}

#[test]
fn collection_keeps_images_in_use_and_removes_the_least_recently_used() {
    let reg = TestRegistry::start("gc", false, false);
    let c = Cache::new("gc");
    let mut digests = Vec::new();
    for i in 0..3 {
        let payload = vec![i as u8; 1 << 20];
        let layer = files_layer(&[("usr/bin/bash", BASH, 0o755), ("payload", &payload, 0o644)]);
        let d = reg.push(&format!("img{i}"), "1", &[(TAR_LAYER, layer)], serde_json::json!({}));
        let Look::Ready(_) = pull(&c, &reg, &format!("{}/img{i}:1", reg.host)) else { panic!() };
        digests.push(d);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let per_image = c.images.bytes() / 3;
    // img0 is the least recently used, but in use: img1 goes instead.
    let in_use: BTreeSet<String> = [digests[0].clone()].into();
    let got = c.images.gc(2 * per_image, &in_use);
    assert_eq!(got.removed, [digests[1].clone()]);
    assert!(got.bytes <= 2 * per_image, "{got:?}");
    let left: Vec<String> = c.images.cached().into_iter().map(|x| x.digest).collect();
    assert!(left.contains(&digests[0]) && left.contains(&digests[2]));
    // Pruning everything not in use.
    let got = c.images.gc(0, &in_use);
    assert_eq!(got.removed, [digests[2].clone()]);
    assert_eq!(c.images.store().blobs().len(), 1, "only the in-use image's layer is left");
    // A removed image is pulled again when asked for.
    let Look::Ready(img) = pull(&c, &reg, &format!("{}/img1:1", reg.host)) else { panic!() };
    assert!(img.rootfs.join("payload").is_file());
}

#[test]
fn an_interrupted_pull_leaves_nothing_half_visible() {
    let dir = std::env::temp_dir().join(format!("ty-cache-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let images = Images::open(&dir, None).unwrap();
    // What a crash mid-unpack leaves: a half-made image under tmp/.
    let half = images.store().tmp_dir().join("image-1-0/rootfs/usr");
    std::fs::create_dir_all(&half).unwrap();
    drop(images);
    let images = Images::open(&dir, None).unwrap();
    assert_eq!(std::fs::read_dir(images.store().tmp_dir()).unwrap().count(), 0);
    assert!(images.cached().is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mirrors_are_tried_first_and_the_registry_after_them() {
    let origin = TestRegistry::start("origin", false, false);
    let mirror = TestRegistry::start("mirror", false, false);
    let layer = base_layer();
    // The mirror has the image; the origin has it too, and must not be asked for its layers.
    mirror.push("team/m", "1", &[(TAR_LAYER, layer.clone())], serde_json::json!({}));
    origin.push("team/m", "1", &[(TAR_LAYER, layer.clone())], serde_json::json!({}));
    let only_origin = files_layer(&[("usr/bin/bash", BASH, 0o755), ("only", b"origin", 0o644)]);
    origin.push("team/o", "1", &[(TAR_LAYER, only_origin.clone())], serde_json::json!({}));
    let mut access = origin.access();
    access.registries.get_mut(&origin.host).unwrap().mirrors = vec![mirror.host.clone()];
    access.registries.insert(
        mirror.host.clone(),
        trainyard_core::catalog::Registry { insecure: true, ..Default::default() },
    );
    let c = Cache::new("mirrors");
    let r = format!("{}/team/m:1", origin.host);
    c.images.start(&r, &access);
    let Look::Ready(img) = wait(&c.images, &r, &access) else { panic!("{:?}", c.images.look(&r, &access)) };
    assert_eq!(img.reference, r, "the image keeps its own name");
    assert_eq!(mirror.blob_gets(&sha(&layer)), 1, "{}", mirror.log());
    assert_eq!(origin.blob_gets(&sha(&layer)), 0, "{}", origin.log());
    // What the mirror does not have comes from the registry itself.
    let r = format!("{}/team/o:1", origin.host);
    c.images.start(&r, &access);
    assert!(matches!(wait(&c.images, &r, &access), Look::Ready(_)));
    assert_eq!(origin.blob_gets(&sha(&only_origin)), 1);
}

#[test]
fn a_full_disk_is_said_as_such() {
    let reg = TestRegistry::start("full", false, false);
    let big: Vec<u8> = (0..6u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
    let layer = files_layer(&[("usr/bin/bash", BASH, 0o755), ("big", &big, 0o644)]);
    let layer_digest = trainyard_images::testing::digest_of(&layer);
    reg.push("big", "1", &[(TAR_LAYER, layer)], serde_json::json!({}));
    let dir = std::env::temp_dir().join(format!("ty-cache-full-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A 4 MiB file system for the cache (the tests run as root, as the local backend needs).
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
        .arg(&dir)
        .status()
        .is_ok_and(|s| s.success());
    assert!(mounted, "mounting a small tmpfs (needs root)");
    let images = Images::open(&dir.join("cache"), None).unwrap();
    let r = format!("{}/big:1", reg.host);
    images.start(&r, &reg.access());
    let got = wait(&images, &r, &reg.access());
    let _ = std::process::Command::new("umount").arg(&dir).status();
    let _ = std::fs::remove_dir_all(&dir);
    let Look::Failed(e) = got else { panic!("{got:?}") };
    assert_eq!(e.class, FailureClass::DiskFull, "{e}");
    assert!(!e.class.retryable() && e.message.contains("no space left"), "a full disk fails at once: {e}");
    // Known from the manifest's sizes: refused before a byte of the layer was fetched.
    assert!(e.message.contains("its layers weigh"), "{e}");
    assert_eq!(reg.blob_gets(&layer_digest), 0, "the layer was fetched anyway");
}
