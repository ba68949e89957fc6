//! The server's image for the Kubernetes test stack's registry, built from this build's binary: what
//! `kube_deploy.rs` deploys and what `kube_pods.rs`'s replicas fetch their working directory with.

use serde_json::json;
use std::process::Command;
use trainyard_images::testing::{
    TAR_LAYER, debian_closure, dirs_layer, host_layer, owned_files_layer, push_to,
};

/// The server's image: this build's binary (debug symbols stripped) where the Containerfile puts it, with what
/// the Containerfile installs, and its user.
pub fn push(registry: &str) -> String {
    let stripped = std::env::temp_dir().join(format!("ty-server-binary-{}", std::process::id()));
    let out = Command::new("strip")
        .args(["--strip-debug", "-o"])
        .arg(&stripped)
        .arg(env!("CARGO_BIN_EXE_trainyard"))
        .output()
        .unwrap();
    assert!(out.status.success(), "strip: {}", String::from_utf8_lossy(&out.stderr));
    let bytes = std::fs::read(&stripped).unwrap();
    let _ = std::fs::remove_file(&stripped);
    let binary = owned_files_layer(&[("usr/local/bin/trainyard", &bytes, 0o755, 0)]);
    let mut files = debian_closure(&["libc6", "libgcc-s1", "ca-certificates", "openssh-client", "tini"]);
    files.push("/etc/ssl/certs/ca-certificates.crt".into());
    let etc = owned_files_layer(&[
        (
            "etc/passwd",
            b"root:x:0:0:root:/root:/bin/sh\ntrainyard:x:65532:65532::/var/lib/trainyard:/usr/sbin/nologin\n",
            0o644,
            0,
        ),
        ("etc/group", b"root:x:0:\ntrainyard:x:65532:\n", 0o644, 0),
        ("etc/nsswitch.conf", b"passwd: files\ngroup: files\nhosts: files dns\n", 0o644, 0),
    ]);
    let dirs = dirs_layer(&[("tmp", 0o1777), ("var/lib/trainyard", 0o700)]);
    let (repo, tag) = ("trainyard/server", "e2e-1");
    push_to(
        registry,
        repo,
        tag,
        &[(TAR_LAYER, host_layer(&files)), (TAR_LAYER, binary), (TAR_LAYER, etc), (TAR_LAYER, dirs)],
        json!({
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "User": "65532:65532",
            "WorkingDir": "/var/lib/trainyard",
            "Entrypoint": ["/usr/bin/tini", "--", "/usr/local/bin/trainyard"],
            "Cmd": ["up", "--backend", "kubernetes", "--listen", "0.0.0.0:8080", "--data-dir", "/var/lib/trainyard"],
            "StopSignal": "SIGINT",
        }),
    );
    format!("{registry}/{repo}:{tag}")
}
