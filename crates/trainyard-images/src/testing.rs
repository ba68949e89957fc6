//! Test support (feature `testing`): a real registry (the CNCF distribution registry, Debian's
//! `docker-registry`) started on 127.0.0.1 with or without TLS and basic auth, images built from layers the
//! tests write and pushed to it, and a proxy in front of it that fails the first connections.

use crate::{Access, Credential};
use oci_client::client::{
    Certificate, CertificateEncoding, ClientConfig, ClientProtocol, Config, ImageLayer,
};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use sha2::Digest;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use trainyard_core::catalog::Registry;

/// The gzip layer media type.
pub const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The plain tar layer media type.
pub const TAR_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// A registry process of one test, removed with its storage when dropped.
#[derive(Debug)]
pub struct TestRegistry {
    /// `127.0.0.1:PORT`.
    pub host: String,
    pub dir: PathBuf,
    /// Its CA, when it serves TLS.
    pub ca: Option<PathBuf>,
    pub user: Option<(String, String)>,
    child: Child,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl TestRegistry {
    /// Starts a registry; `tls`: serve HTTPS with a CA made for it; `auth`: basic auth for user `trainyard`.
    pub fn start(name: &str, tls: bool, auth: bool) -> TestRegistry {
        let dir = std::env::temp_dir().join(format!("ty-registry-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let port = free_port();
        let host = format!("127.0.0.1:{port}");
        let mut conf = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n    \
             rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {host}\n",
            dir.join("data").display()
        );
        let mut ca = None;
        if tls {
            let d = |f: &str| dir.join(f).display().to_string();
            run(Command::new("openssl")
                .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2"])
                .args(["-subj", "/CN=trainyard test CA", "-keyout", &d("ca.key"), "-out", &d("ca.pem")]));
            run(Command::new("openssl")
                .args(["req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1"])
                .args(["-keyout", &d("server.key"), "-out", &d("server.csr")]));
            std::fs::write(
                dir.join("ext.cnf"),
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
            )
            .unwrap();
            run(Command::new("openssl").args(["x509", "-req", "-days", "2", "-in", &d("server.csr")]).args(
                [
                    "-CA",
                    &d("ca.pem"),
                    "-CAkey",
                    &d("ca.key"),
                    "-CAcreateserial",
                    "-extfile",
                    &d("ext.cnf"),
                    "-out",
                    &d("server.pem"),
                ],
            ));
            conf.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                d("server.pem"),
                d("server.key")
            ));
            ca = Some(dir.join("ca.pem"));
        }
        let mut user = None;
        if auth {
            let password = format!("trainyard-secret-{port}-{}", std::process::id());
            // The registry reads bcrypt hashes; glibc's crypt makes them ($2b$ and $2a$ are one algorithm).
            let out = Command::new("python3")
                .args([
                    "-W",
                    "ignore",
                    "-c",
                    "import crypt,sys; print(crypt.crypt(sys.argv[1], crypt.mksalt(crypt.METHOD_BLOWFISH)))",
                ])
                .arg(&password)
                .output()
                .unwrap();
            let hash = String::from_utf8_lossy(&out.stdout).trim().replacen("$2b$", "$2a$", 1);
            assert!(hash.starts_with("$2a$"), "bcrypt from python3: {hash:?}");
            std::fs::write(dir.join("htpasswd"), format!("trainyard:{hash}\n")).unwrap();
            conf.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: trainyard-test\n    path: {}\n",
                dir.join("htpasswd").display()
            ));
            user = Some(("trainyard".to_owned(), password));
        }
        std::fs::write(dir.join("config.yml"), conf).unwrap();
        let log = std::fs::File::create(dir.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("docker-registry (Debian's package docker-registry) runs");
        let t0 = std::time::Instant::now();
        while std::net::TcpStream::connect(&host).is_err() {
            assert!(
                t0.elapsed().as_secs() < 30,
                "the registry did not listen on {host}: {}",
                std::fs::read_to_string(dir.join("registry.log")).unwrap_or_default()
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        TestRegistry { host, dir, ca, user, child }
    }

    /// How the cache reaches this registry (its CA, its credentials), allowed under its own name.
    pub fn access(&self) -> Access {
        let mut a = Access::default();
        a.registries.insert(
            self.host.clone(),
            Registry {
                mirrors: Vec::new(),
                insecure: self.ca.is_none(),
                ca_bundle: self.ca.as_ref().map(|p| p.display().to_string()),
            },
        );
        if let Some((u, p)) = &self.user {
            a.credentials.insert(self.host.clone(), Credential { username: u.clone(), password: p.clone() });
        }
        a
    }

    /// The registry's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// How many times a blob was served (`GET .../blobs/DIGEST` answered 200).
    pub fn blob_gets(&self, digest: &str) -> usize {
        self.log()
            .lines()
            .filter(|l| {
                l.contains("\"GET /v2/") && l.contains(&format!("/blobs/{digest} ")) && l.contains("\" 200 ")
            })
            .count()
    }

    /// How many times each blob was served, by digest.
    pub fn blobs_served(&self) -> std::collections::BTreeMap<String, usize> {
        let mut out = std::collections::BTreeMap::new();
        for l in self.log().lines().filter(|l| l.contains("\"GET /v2/") && l.contains("\" 200 ")) {
            if let Some(d) = l.split("/blobs/").nth(1).and_then(|r| r.split([' ', '"']).next()) {
                *out.entry(d.to_owned()).or_default() += 1;
            }
        }
        out
    }

    /// Where the registry keeps a blob's bytes (to damage it).
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.join(format!("data/docker/registry/v2/blobs/sha256/{}/{hex}/data", &hex[..2]))
    }

    fn client(&self) -> (Client, RegistryAuth) {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = ClientConfig {
            protocol: if self.ca.is_some() { ClientProtocol::Https } else { ClientProtocol::Http },
            extra_root_certificates: self
                .ca
                .iter()
                .map(|p| Certificate { encoding: CertificateEncoding::Pem, data: std::fs::read(p).unwrap() })
                .collect(),
            ..ClientConfig::default()
        };
        let auth = match &self.user {
            Some((u, p)) => RegistryAuth::Basic(u.clone(), p.clone()),
            None => RegistryAuth::Anonymous,
        };
        (Client::new(config), auth)
    }

    /// Pushes an image of `layers` (each `(media type, bytes)`) with `config` (the image config's `config`
    /// object: Env, WorkingDir, User); returns the manifest's digest.
    pub fn push(
        &self,
        repo: &str,
        tag: &str,
        layers: &[(&str, Vec<u8>)],
        config: serde_json::Value,
    ) -> String {
        let (client, auth) = self.client();
        push_with(&client, &auth, &self.host, repo, tag, layers, config)
    }
}

/// Pushes an image as [`TestRegistry::push`] does, to a registry of someone else's on `host` (plain HTTP,
/// no login: the Kubernetes test stack's registry).
pub fn push_to(
    host: &str,
    repo: &str,
    tag: &str,
    layers: &[(&str, Vec<u8>)],
    config: serde_json::Value,
) -> String {
    push_to_as(host, None, repo, tag, layers, config)
}

/// Pushes an image as [`push_to`] does, with a login (`user`, `password`) where the registry needs one.
pub fn push_to_as(
    host: &str,
    login: Option<(&str, &str)>,
    repo: &str,
    tag: &str,
    layers: &[(&str, Vec<u8>)],
    config: serde_json::Value,
) -> String {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = Client::new(ClientConfig { protocol: ClientProtocol::Http, ..ClientConfig::default() });
    let auth =
        login.map_or(RegistryAuth::Anonymous, |(u, p)| RegistryAuth::Basic(u.to_owned(), p.to_owned()));
    push_with(&client, &auth, host, repo, tag, layers, config)
}

fn push_with(
    client: &Client,
    auth: &RegistryAuth,
    host: &str,
    repo: &str,
    tag: &str,
    layers: &[(&str, Vec<u8>)],
    config: serde_json::Value,
) -> String {
    let diff_ids: Vec<String> = layers
        .iter()
        .map(|(t, b)| {
            let plain = if t.ends_with("gzip") { gunzip(b) } else { b.clone() };
            format!("sha256:{:x}", sha2::Sha256::digest(&plain))
        })
        .collect();
    let doc = serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    });
    let layers: Vec<ImageLayer> =
        layers.iter().map(|(t, b)| ImageLayer::new(b.clone(), (*t).to_owned(), None)).collect();
    let config = Config::oci_v1(serde_json::to_vec(&doc).unwrap(), None);
    let reference = Reference::with_tag(host.to_owned(), repo.to_owned(), tag.to_owned());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        client.push(&reference, &layers, config, auth, None).await.expect("push");
        client.fetch_manifest_digest(&reference, auth).await.expect("the pushed manifest's digest")
    })
}

impl Drop for TestRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The digest of a blob's bytes.
pub fn digest_of(b: &[u8]) -> String {
    format!("sha256:{:x}", sha2::Sha256::digest(b))
}

pub fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(b).read_to_end(&mut out).unwrap();
    out
}

pub fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

/// A layer of files (`path`, contents, mode), owned by root.
pub fn files_layer(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let owned: Vec<(&str, &[u8], u32, u64)> = files.iter().map(|(p, d, m)| (*p, *d, *m, 0)).collect();
    owned_files_layer(&owned)
}

/// A layer of directories with their modes (`tmp` with 0o1777, say), owned by root.
pub fn dirs_layer(dirs: &[(&str, u32)]) -> Vec<u8> {
    let owned: Vec<(&str, u32, u64)> = dirs.iter().map(|(p, m)| (*p, *m, 0)).collect();
    owned_dirs_layer(&owned)
}

/// A layer of directories with their modes and owners' uid and gid (a user's home, say).
pub fn owned_dirs_layer(dirs: &[(&str, u32, u64)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (p, mode, uid) in dirs {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_uid(*uid);
        h.set_gid(*uid);
        h.set_mode(*mode);
        h.set_size(0);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, format!("{}/", p.trim_end_matches('/')), std::io::empty()).unwrap();
    }
    b.into_inner().unwrap()
}

/// A layer of files (`path`, contents, mode, owner's uid and gid).
pub fn owned_files_layer(files: &[(&str, &[u8], u32, u64)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (p, data, mode, uid) in files {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_uid(*uid);
        h.set_gid(*uid);
        h.set_mode(*mode);
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, p, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// One entry of a hand-made layer.
#[derive(Debug, Clone, Copy)]
pub enum Raw<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8]),
    /// A symlink (`path`, target).
    Sym(&'a str, &'a str),
    /// A hard link (`path`, the path it links to).
    Hard(&'a str, &'a str),
    Fifo(&'a str),
}

/// A layer of `entries`, names and link targets written into the header as they are (a hostile layer may
/// carry `..` and absolute links, which tar's builder refuses to write; each must fit the header's 100 bytes).
pub fn raw_layer(entries: &[Raw]) -> Vec<u8> {
    fn put(field: &mut [u8; 100], text: &str) {
        assert!(text.len() < 100, "{text} does not fit a tar header's field");
        *field = [0; 100];
        field[..text.len()].copy_from_slice(text.as_bytes());
    }
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        let (kind, path, link, data, mode): (_, &str, Option<&str>, &[u8], u32) = match *e {
            Raw::Dir(p) => (tar::EntryType::Directory, p, None, b"", 0o755),
            Raw::File(p, d) => (tar::EntryType::Regular, p, None, d, 0o644),
            Raw::Sym(p, to) => (tar::EntryType::Symlink, p, Some(to), b"", 0o777),
            Raw::Hard(p, to) => (tar::EntryType::Link, p, Some(to), b"", 0o644),
            Raw::Fifo(p) => (tar::EntryType::Fifo, p, None, b"", 0o644),
        };
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_size(data.len() as u64);
        put(&mut h.as_old_mut().name, path);
        if let Some(l) = link {
            put(&mut h.as_old_mut().linkname, l);
        }
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A layer of this machine's files at `paths` (and the dirs and symlinks on the way to them, so that
/// `/bin/bash` comes with the `bin -> usr/bin` link a merged-/usr system has), as they are here.
pub fn host_layer(paths: &[PathBuf]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    let mut done = std::collections::BTreeSet::new();
    for p in paths {
        add_host_path(&mut b, p, &mut done);
    }
    b.into_inner().unwrap()
}

fn add_host_path(b: &mut tar::Builder<Vec<u8>>, p: &Path, done: &mut std::collections::BTreeSet<PathBuf>) {
    if p == Path::new("/") || !done.insert(p.to_path_buf()) {
        return;
    }
    if let Some(parent) = p.parent() {
        add_host_path(b, parent, done);
    }
    let Ok(m) = std::fs::symlink_metadata(p) else { return };
    let rel = p.strip_prefix("/").unwrap();
    if m.is_dir() {
        b.append_dir(rel, p).unwrap();
    } else if m.file_type().is_symlink() {
        b.append_path_with_name(p, rel).unwrap();
        let to = std::fs::read_link(p).unwrap();
        let to = if to.is_absolute() { to } else { p.parent().unwrap().join(to) };
        // `..` taken lexically: the tar builder refuses such names.
        let mut norm = PathBuf::from("/");
        for c in to.components() {
            match c {
                std::path::Component::Normal(x) => norm.push(x),
                std::path::Component::ParentDir => {
                    norm.pop();
                }
                _ => {}
            }
        }
        add_host_path(b, &norm, done);
    } else if m.is_file() {
        b.append_path_with_name(p, rel).unwrap();
    }
}

/// The files of installed Debian packages and everything they depend on (`Depends`, `Pre-Depends`): what an
/// image built from those packages would carry.
pub fn debian_closure(packages: &[&str]) -> Vec<PathBuf> {
    let mut seen = std::collections::BTreeSet::new();
    let mut todo: Vec<String> = packages.iter().map(|s| (*s).to_owned()).collect();
    let installed = |p: &str| {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", p])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).ends_with("installed"))
    };
    while let Some(p) = todo.pop() {
        if !seen.insert(p.clone()) {
            continue;
        }
        let out =
            Command::new("dpkg-query").args(["-W", "-f=${Depends},${Pre-Depends}", &p]).output().unwrap();
        for alt in String::from_utf8_lossy(&out.stdout).split(',') {
            for a in alt.split('|') {
                let name = a.trim().split([' ', ':', '(']).next().unwrap_or("").to_owned();
                if !name.is_empty() && installed(&name) {
                    todo.push(name);
                    break;
                }
            }
        }
    }
    let mut files = Vec::new();
    for p in &seen {
        let out = Command::new("dpkg-query").args(["-L", p]).output().unwrap();
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            let path = PathBuf::from(l);
            if std::fs::symlink_metadata(&path).is_ok_and(|m| !m.is_dir())
                && !l.starts_with("/usr/share/doc")
                && !l.starts_with("/usr/share/man")
            {
                files.push(path);
            }
        }
    }
    // What maintainer scripts make: the alternatives' links (`libblas.so.3` through `/etc/alternatives`)
    // that lead to one of these files.
    let have: std::collections::BTreeSet<PathBuf> = files.iter().cloned().collect();
    for dir in ["/usr/bin", "/usr/sbin", "/usr/lib/x86_64-linux-gnu"] {
        let Ok(rd) = std::fs::read_dir(dir) else { continue };
        for e in rd.flatten() {
            let p = e.path();
            let via_alternatives = std::fs::read_link(&p).is_ok_and(|t| t.starts_with("/etc/alternatives"));
            if via_alternatives && std::fs::canonicalize(&p).is_ok_and(|t| have.contains(&t)) {
                files.push(p);
            }
        }
    }
    files.sort();
    files.dedup();
    files
}

/// A proxy in front of a registry that answers its first `fail` connections with `503 Service
/// Unavailable` (a registry that is down, then up again) and passes the rest through.
#[derive(Debug)]
pub struct FlakyProxy {
    /// `127.0.0.1:PORT`.
    pub host: String,
    /// Connections failed so far.
    pub failed: Arc<AtomicUsize>,
}

impl FlakyProxy {
    pub fn start(upstream: &str, fail: usize) -> FlakyProxy {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let host = l.local_addr().unwrap().to_string();
        let failed = Arc::new(AtomicUsize::new(0));
        let (f, up) = (failed.clone(), upstream.to_owned());
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                if f.load(Ordering::SeqCst) < fail {
                    f.fetch_add(1, Ordering::SeqCst);
                    let mut c = c;
                    let mut buf = [0u8; 4096];
                    let _ = c.set_read_timeout(Some(std::time::Duration::from_secs(2)));
                    let _ = c.read(&mut buf);
                    let _ = c.write_all(
                        b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    continue;
                }
                let Ok(u) = std::net::TcpStream::connect(&up) else { continue };
                let (mut c2, mut u2) = (c.try_clone().unwrap(), u.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c2, &mut u2);
                    let _ = u2.shutdown(std::net::Shutdown::Write);
                });
                std::thread::spawn(move || {
                    let (mut c, mut u) = (c, u);
                    let _ = std::io::copy(&mut u, &mut c);
                    let _ = c.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        FlakyProxy { host, failed }
    }
}
