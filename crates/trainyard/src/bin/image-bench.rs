//! The image cache's figures: pull throughput and time to Running for a registry image, uncached and cached,
//! against `skopeo copy` of the same image from the same registry in the same run.
//!
//! The image is built from this machine's Debian packages (`python3-torch`, `bash`, `coreutils` and what they
//! depend on; `--small`: `bash` and `coreutils` only), in four gzip layers, and pushed to a real registry on
//! 127.0.0.1 (Debian's `docker-registry`). Each run:
//!
//! (a) `skopeo copy docker://... oci:DIR` into a fresh dir: fetch and verify, no unpacking;
//! (b) the cache's pull into a fresh cache: fetch and verify (timed to the start of unpacking), then the
//!     whole pull with the read-only root file system ready;
//! (c) the same reference again from a new handle on that cache: one manifest request, no layer;
//! (d) `trainyard up` on a fresh data dir: submit a task on the image until the API says Running (uncached),
//!     then a second task (cached), and one on the `host` image for comparison.
//!
//!   cargo run --release -p trainyard --features image-bench --bin image-bench [-- --runs N --small]

use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use trainyard_images::testing::{GZIP_LAYER, TestRegistry, debian_closure, gzip, host_layer};
use trainyard_images::{Images, Look, Phase};

fn arg(name: &str) -> Option<String> {
    std::env::args().skip_while(|a| a != name).nth(1)
}

fn median(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Splits files into `n` groups of about equal size, in path order.
fn split(files: Vec<PathBuf>, n: usize) -> Vec<Vec<PathBuf>> {
    let size = |p: &PathBuf| std::fs::symlink_metadata(p).map_or(0, |m| m.len());
    let total: u64 = files.iter().map(size).sum();
    let mut out = vec![Vec::new()];
    let mut acc = 0;
    for f in files {
        if acc > total / n as u64 * out.len() as u64 && out.len() < n {
            out.push(Vec::new());
        }
        acc += size(&f);
        out.last_mut().unwrap().push(f);
    }
    out
}

#[path = "shared/up.rs"]
mod up;

/// A `trainyard up` of its own, removed with its data dir when dropped.
struct Server {
    child: std::process::Child,
    api: up::Api,
    dir: PathBuf,
}

impl Server {
    fn start(catalog: &str) -> Server {
        let dir = std::env::temp_dir().join(format!("ty-image-bench-{}-{}", std::process::id(), rand()));
        let (child, api) = up::start(&dir, catalog);
        Server { child, api, dir }
    }

    /// Submits a task on `image` and returns the time until the API says Running.
    fn time_to_running(&self, image: &str) -> f64 {
        let task = json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
            "metadata": {"namePrefix": "bench", "projectGroup": "default"},
            "spec": {"type": "PyTorchJob", "placement": {"region": "local", "cluster": "local"},
                     "environment": {"image": image, "cmd": "exec sleep 1000"},
                     "compute": {"resourceType": "Reserved", "pool": "default", "workers": 0,
                                 "instanceSpecs": [{"spec": "cpu.tiny"}]}}
        });
        let t0 = Instant::now();
        let (status, v) = self.api.call("POST", "/api/v1/tasks", Some(&task.to_string()));
        assert_eq!(status, 201, "{v}");
        let id = v["id"].as_str().unwrap().to_owned();
        loop {
            let s = self.api.status(&id);
            if s == "Running" {
                break;
            }
            assert!(!["Failed", "Succeeded", "Stopped"].contains(&s.as_str()), "task {id} is {s}");
            assert!(t0.elapsed() < Duration::from_secs(600), "task {id} stuck in {s}");
            std::thread::sleep(Duration::from_millis(2));
        }
        let took = t0.elapsed().as_secs_f64();
        self.api.call("POST", &format!("/api/v1/tasks/{id}/stop"), None);
        took
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
        std::thread::sleep(Duration::from_millis(500));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u64
}

/// Pulls `reference` into the cache under `dir`; (seconds to the start of unpacking, seconds in all).
fn pull(dir: &Path, reference: &str, access: &trainyard_images::Access) -> (f64, f64) {
    // As `trainyard up` unpacks: as a uid of its own when this runs as root, within the default bounds.
    let unpack = trainyard_images::Unpack {
        as_id: trainyard_local::isolation_ready().is_ok().then_some(trainyard_local::IMAGE_UNPACK_ID),
        ..Default::default()
    };
    let images = Images::open_with(dir, None, unpack).unwrap();
    let t0 = Instant::now();
    images.start(reference, access);
    let mut fetched = None;
    loop {
        match images.look(reference, access) {
            Look::Ready(_) => break,
            Look::Failed(e) => panic!("{e}"),
            Look::Pulling { phase: Phase::Unpacking, .. } if fetched.is_none() => {
                fetched = Some(t0.elapsed().as_secs_f64())
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let all = t0.elapsed().as_secs_f64();
    (fetched.unwrap_or(all), all)
}

fn main() {
    let runs: usize = arg("--runs").and_then(|n| n.parse().ok()).unwrap_or(3);
    let small = std::env::args().any(|a| a == "--small");
    let packages: &[&str] =
        if small { &["bash", "coreutils"] } else { &["python3-torch", "bash", "coreutils"] };
    let t0 = Instant::now();
    let files = debian_closure(packages);
    let uncompressed: u64 = files.iter().map(|p| std::fs::symlink_metadata(p).map_or(0, |m| m.len())).sum();
    let layers: Vec<Vec<u8>> = split(files, 4).iter().map(|g| gzip(&host_layer(g))).collect();
    let compressed: u64 = layers.iter().map(|l| l.len() as u64).sum();
    let reg = TestRegistry::start("bench", false, false);
    let pushed: Vec<(&str, Vec<u8>)> = layers.into_iter().map(|l| (GZIP_LAYER, l)).collect();
    let digest = reg.push("bench/torch", "1", &pushed, json!({}));
    drop(pushed);
    let reference = format!("{}/bench/torch:1", reg.host);
    let mib = |b: u64| b as f64 / 1048576.0;
    println!(
        "image {reference} ({digest}): {} packages' files, {:.0} MiB in 4 gzip layers ({:.0} MiB unpacked); built and pushed in {:.1} s",
        packages.join(" + "),
        mib(compressed),
        mib(uncompressed),
        t0.elapsed().as_secs_f64()
    );
    let access = reg.access();
    let work = std::env::temp_dir().join(format!("ty-image-bench-work-{}", std::process::id()));
    let (mut skopeo, mut fetch, mut whole, mut cached, mut ratio) = (vec![], vec![], vec![], vec![], vec![]);
    let mut unpacking = vec![];
    for r in 0..runs {
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).unwrap();
        let t = Instant::now();
        let out = Command::new("skopeo")
            .args(["copy", "--quiet", "--src-tls-verify=false", &format!("docker://{reference}")])
            .arg(format!("oci:{}:bench", work.join(format!("skopeo-{r}")).display()))
            .output()
            .expect("skopeo (Debian's package skopeo) runs");
        assert!(out.status.success(), "skopeo: {}", String::from_utf8_lossy(&out.stderr));
        let s = t.elapsed().as_secs_f64();
        let (f, w) = pull(&work.join(format!("cache-{r}")), &reference, &access);
        let (_, c) = pull(&work.join(format!("cache-{r}")), &reference, &access);
        skopeo.push(s);
        fetch.push(f);
        whole.push(w);
        unpacking.push(w - f);
        cached.push(c);
        ratio.push(f / s);
    }
    let _ = std::fs::remove_dir_all(&work);
    println!("\npull, {runs} runs (median [min, max]); MiB/s of the compressed image:");
    for (label, v) in [
        ("skopeo copy to an OCI dir", &mut skopeo),
        ("cache: fetched and verified", &mut fetch),
        ("cache: ready to run (unpacked)", &mut whole),
        ("cache: unpacking alone", &mut unpacking),
        ("cache: again (cached)", &mut cached),
    ] {
        let (m, lo, hi) = median(v);
        println!("  {label:<34} {:>8.3} s [{lo:.3}, {hi:.3}]  {:>7.0} MiB/s", m, mib(compressed) / m);
    }
    let (m, lo, hi) = median(&mut ratio);
    println!("  fetch time / skopeo time (same run) {m:.2} [{lo:.2}, {hi:.2}]");

    // Time to Running through the server.
    let catalog = format!(
        r#"
regions: {{local: {{}}}}
clusters: {{local: {{region: local}}}}
pools: {{default: {{cluster: local, instanceSpecs: [cpu.tiny]}}}}
instanceSpecs: {{cpu.tiny: {{kind: CPU, vcpus: 1, memoryMib: 256}}}}
nodes: {{node-a: {{pool: default, vcpus: 16, memoryMib: 8192}}}}
projectGroups: {{default: {{}}}}
images: {{host: {{}}}}
allowExternalImages: true
registries: {{"{}": {{insecure: true}}}}
quotas: [{{group: default, resourceType: Reserved, pool: default, spec: cpu.tiny, units: 16}}]
"#,
        reg.host
    );
    let (mut uncached_run, mut cached_run, mut host_run) = (vec![], vec![], vec![]);
    for _ in 0..runs {
        let server = Server::start(&catalog);
        uncached_run.push(server.time_to_running(&reference));
        cached_run.push(server.time_to_running(&reference));
        host_run.push(server.time_to_running("host"));
    }
    println!("\nsubmit until the API says Running, {runs} runs (median [min, max]):");
    for (label, v) in [
        ("uncached image", &mut uncached_run),
        ("cached image", &mut cached_run),
        ("host image", &mut host_run),
    ] {
        let (m, lo, hi) = median(v);
        println!("  {label:<34} {:>8.3} s [{lo:.3}, {hi:.3}]", m);
    }
}
