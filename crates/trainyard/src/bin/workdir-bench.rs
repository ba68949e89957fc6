//! A working directory's upload, measured against the usual ways of moving a tree to another machine, in one
//! run on this machine (issue 34):
//!
//! - Trainyard: `trainyard submit -f task.yaml --workdir DIR` (the CLI packs, checks, sends what the group
//!   lacks, commits, then creates the task), to a fresh group, then the same tree again (a resubmit);
//! - `tar czf` then `scp` to localhost (through an sshd of the benchmark's own), first and again (it has no
//!   memory of what was sent);
//! - `rsync -a` over ssh to localhost, first and again (unchanged: its file lists only).
//!
//! The tree: `--files` files (default 10,000) in 100 dirs, `--mb` MB in all (default 200): half of the files
//! random bytes (as data, weights, archives), half text that compresses (as code). Each figure is the median
//! of `--runs` runs (default 3) with its min and max; bytes sent are what the client sent: Trainyard's
//! manifest (twice on a first upload: check and commit; once again: the check keeps it) and tar streams, computed with the CLI's own code and checked against
//! the server's count of what it took in; the compressed archive for scp; rsync's own `Total bytes sent`.
//!
//!   cargo build --release -p trainyard && cargo run --release -p trainyard --bin workdir-bench [-- --runs N]
//!
//! Needs `rsync`, `ssh` and `sshd` (`apt-get install rsync openssh-server openssh-client`). The server is
//! `trainyard up --backend fake` (nothing runs; the upload is the figure); it keeps what it takes in on its
//! data dir's disk with each file synced, as it always does; rsync and scp write without syncing.

#[path = "shared/stats.rs"]
mod stats;
#[path = "shared/up.rs"]
mod up;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A tree of `files` files, `bytes` in all, half random and half compressible text.
fn make_tree(dir: &Path, files: u64, bytes: u64) {
    let each = (bytes / files.max(1)) as usize;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let text: Vec<u8> =
        b"def step(batch, model, optimizer):\n    loss = model(batch).mean()\n    loss.backward()\n"
            .iter()
            .copied()
            .cycle()
            .take(each)
            .collect();
    for i in 0..files {
        let sub = dir.join(format!("d{:03}", i % 100));
        std::fs::create_dir_all(&sub).unwrap();
        let content: Vec<u8> = if i % 2 == 0 {
            (0..each.div_ceil(8)).flat_map(|_| next().to_le_bytes()).take(each).collect()
        } else {
            let mut t = text.clone();
            t.extend(format!("# file {i}\n").bytes());
            t
        };
        std::fs::write(sub.join(format!("f{i:05}.py")), content).unwrap();
    }
}

/// Runs `c`; its wall time in seconds and its standard output. Panics when it fails.
fn timed(c: &mut Command) -> (f64, String) {
    let t0 = Instant::now();
    let out = c.stderr(Stdio::piped()).output().unwrap();
    let took = t0.elapsed().as_secs_f64();
    assert!(out.status.success(), "{c:?}: {}", String::from_utf8_lossy(&out.stderr));
    (took, String::from_utf8_lossy(&out.stdout).into_owned())
}

/// An sshd of the benchmark's own on `port`, letting in the key under `dir`.
fn sshd(dir: &Path, port: u16) -> (std::process::Child, Vec<String>) {
    let key = dir.join("id");
    let host = dir.join("host");
    for (k, t) in [(&key, "ed25519"), (&host, "ed25519")] {
        let _ = std::fs::remove_file(k);
        assert!(
            Command::new("ssh-keygen")
                .args(["-q", "-t", t, "-N", "", "-f"])
                .arg(k)
                .status()
                .unwrap()
                .success()
        );
    }
    std::fs::copy(dir.join("id.pub"), dir.join("authorized_keys")).unwrap();
    let cfg = dir.join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\nPidFile {}\nStrictModes no\n\
             UsePAM no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\nSubsystem sftp internal-sftp\n",
            host.display(),
            dir.join("authorized_keys").display(),
            dir.join("sshd.pid").display()
        ),
    )
    .unwrap();
    std::fs::create_dir_all("/run/sshd").unwrap();
    let child =
        Command::new("/usr/sbin/sshd").arg("-D").arg("-f").arg(&cfg).stderr(Stdio::null()).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let ssh = vec![
        "-i".to_owned(),
        key.display().to_string(),
        "-p".to_owned(),
        port.to_string(),
        "-o".to_owned(),
        "StrictHostKeyChecking=no".to_owned(),
        "-o".to_owned(),
        "UserKnownHostsFile=/dev/null".to_owned(),
        "-o".to_owned(),
        "LogLevel=ERROR".to_owned(),
    ];
    (child, ssh)
}

fn summary(name: &str, v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = stats::percentile(v, 0.5);
    println!("  {name:<36} {mid:>7.2} s  [{:.2}, {:.2}]", v[0], v[v.len() - 1]);
    mid
}

/// Regular files under `dir`.
fn walk_files(dir: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let t = e.file_type().unwrap();
        if t.is_dir() {
            n += walk_files(&e.path());
        } else if t.is_file() {
            n += 1;
        }
    }
    n
}

fn main() {
    let (files, mb, runs) = (arg("--files", 10_000), arg("--mb", 200), arg("--runs", 3).max(1));
    let root = std::env::temp_dir().join(format!("ty-workdir-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let tree = root.join("tree");
    make_tree(&tree, files, mb * 1_000_000);
    let groups: Vec<String> = (0..runs).map(|i| format!("g{i}")).collect();
    let catalog = format!(
        "regions: {{local: {{}}}}\nclusters: {{local: {{region: local}}}}\n\
         pools: {{default: {{cluster: local, instanceSpecs: [cpu.tiny]}}}}\n\
         instanceSpecs: {{cpu.tiny: {{kind: CPU, vcpus: 1, memoryMib: 256}}}}\n\
         nodes: {{node-a: {{pool: default, vcpus: 64, memoryMib: 65536}}}}\n\
         projectGroups: {{{}}}\nimages: {{host: {{}}}}\nquotas: [{}]\n",
        groups.iter().map(|g| format!("{g}: {{}}")).collect::<Vec<_>>().join(", "),
        groups
            .iter()
            .map(|g| format!(
                "{{group: {g}, resourceType: Reserved, pool: default, spec: cpu.tiny, units: 64}}"
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let (mut server, api) = up::start_with(&root.join("data"), &catalog, &["--backend", "fake"]);
    let token = api.auth.trim_start_matches("Bearer ").to_owned();
    let exe = std::env::current_exe().unwrap().with_file_name("trainyard");
    // What the CLI sends, by its own code: the manifest twice, and the tar streams of every file once.
    let packed = trainyard_workdir::pack::pack(&tree, u64::MAX).expect("the tree packs");
    let manifest = serde_json::to_vec(&serde_json::json!({"projectGroup": "g0", "manifest": packed.manifest}))
        .unwrap()
        .len() as u64;
    let all: Vec<String> = packed.sources.keys().cloned().collect();
    let streams: u64 =
        trainyard_workdir::pack::batches(&packed, &all, 32 << 20).map(|b| b.unwrap().0.len() as u64).sum();
    let received = || -> u64 {
        let mut r = api
            .agent
            .get(&format!("{}/metrics", api.base))
            .header("Authorization", &api.auth)
            .call()
            .unwrap();
        let text = r.body_mut().read_to_string().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("trainyard_workdir_received_bytes_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let (mut sshd, ssh) = sshd(&root, 22_000 + (std::process::id() % 1000) as u16);
    let e = format!("ssh {}", ssh.join(" "));
    let (mut ty1, mut ty2, mut tar1, mut tar2, mut rs1, mut rs2) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut fetch = vec![];
    let (mut tgz, mut rs_first, mut rs_again) = (0u64, 0u64, 0u64);
    let rsync_sent = |out: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix("Total bytes sent: "))
            .map(|v| v.replace(',', "").trim().parse().unwrap_or(0))
            .unwrap_or(0)
    };
    for (i, g) in groups.iter().enumerate() {
        let task = root.join(format!("task-{g}.yaml"));
        std::fs::write(
            &task,
            format!(
                "apiVersion: trainyard.dev/v1\nkind: TrainingTask\nmetadata: {{namePrefix: up, projectGroup: {g}}}\n\
                 spec:\n  type: PyTorchJob\n  placement: {{region: local, cluster: local}}\n  \
                 environment: {{image: host, cmd: python3 train.py}}\n  compute: {{resourceType: Reserved, \
                 pool: default, workers: 0, instanceSpecs: [{{spec: cpu.tiny}}]}}\n"
            ),
        )
        .unwrap();
        let submit = || {
            let mut c = Command::new(&exe);
            c.args(["submit", "-f"])
                .arg(&task)
                .arg("--workdir")
                .arg(&tree)
                .env("TRAINYARD_SERVER", &api.base)
                .env("TRAINYARD_TOKEN", &token)
                .stdout(Stdio::null());
            timed(&mut c).0
        };
        let before = received();
        ty1.push(submit());
        let took_in = received() - before;
        let distinct: u64 = packed.manifest.blobs().values().sum();
        assert_eq!(took_in, distinct, "the server took in each distinct file once");
        ty2.push(submit());
        assert_eq!(received() - before, took_in, "nothing sent again");
        // The copy a Kubernetes replica's init container makes: `trainyard workdir fetch` into an empty
        // directory (every file checked against its digest, then made).
        let mut r = api
            .agent
            .get(&format!("{}/api/v1/workdirs?projectGroup={g}", api.base))
            .header("Authorization", &api.auth)
            .call()
            .unwrap();
        let listed: serde_json::Value =
            serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
        let id = listed["items"][0]["id"].as_str().expect("the group holds the working directory").to_owned();
        let into = root.join(format!("fetch-{i}"));
        let (t, _) = timed(
            Command::new(&exe)
                .args(["workdir", "fetch", &id, "--group", g, "--into"])
                .arg(&into)
                .env("TRAINYARD_SERVER", &api.base)
                .env("TRAINYARD_TOKEN", &token),
        );
        fetch.push(t);
        let made = walk_files(&into);
        assert_eq!(made, files, "every file made");
        let _ = std::fs::remove_dir_all(&into);
        // tar czf, then scp.
        let tgz_path = root.join("tree.tgz");
        let dest = root.join(format!("scp-{i}"));
        std::fs::create_dir_all(&dest).unwrap();
        for times in [&mut tar1, &mut tar2] {
            let t0 = Instant::now();
            timed(Command::new("tar").arg("czf").arg(&tgz_path).arg("-C").arg(&tree).arg("."));
            timed(
                Command::new("scp")
                    .arg("-q")
                    .args(ssh.iter().map(|a| if a == "-p" { "-P" } else { a }))
                    .arg(&tgz_path)
                    .arg(format!("root@127.0.0.1:{}/tree.tgz", dest.display())),
            );
            times.push(t0.elapsed().as_secs_f64());
            tgz = std::fs::metadata(&tgz_path).unwrap().len();
        }
        // rsync over ssh.
        let dest = root.join(format!("rsync-{i}"));
        for (times, sent) in [(&mut rs1, &mut rs_first), (&mut rs2, &mut rs_again)] {
            let (t, out) = timed(
                Command::new("rsync")
                    .args(["-a", "--stats", "-e", &e])
                    .arg(format!("{}/", tree.display()))
                    .arg(format!("root@127.0.0.1:{}/", dest.display())),
            );
            times.push(t);
            *sent = rsync_sent(&out);
        }
        let _ = std::fs::remove_dir_all(root.join(format!("scp-{i}")));
        let _ = std::fs::remove_dir_all(&dest);
    }
    println!(
        "workdir-bench: {files} files, {:.0} MB (half random, half text), {runs} runs each, median [min, max]",
        packed.manifest.bytes() as f64 / 1e6
    );
    let t1 = summary("trainyard submit --workdir, first", &mut ty1);
    let t2 = summary("trainyard submit --workdir, again", &mut ty2);
    let s1 = summary("tar czf + scp, first", &mut tar1);
    summary("tar czf + scp, again", &mut tar2);
    let f1 = summary("trainyard workdir fetch (a replica's copy)", &mut fetch);
    let r1 = summary("rsync -a over ssh, first", &mut rs1);
    let r2 = summary("rsync -a over ssh, again", &mut rs2);
    println!(
        "  bytes sent, first:  trainyard {} (manifest {manifest} twice + tar streams {streams}), tar+scp {tgz}, rsync {rs_first}",
        2 * manifest + streams
    );
    println!(
        "  bytes sent, again:  trainyard {manifest} (the manifest once), tar+scp {tgz}, rsync {rs_again}"
    );
    println!(
        "  ratios (time): first, trainyard/tar+scp {:.2}, trainyard/rsync {:.2}; again, trainyard/rsync {:.2}; \
         fetch/rsync first {:.2}",
        t1 / s1,
        t1 / r1,
        t2 / r2,
        f1 / r1
    );
    let _ = sshd.kill();
    let _ = server.kill();
    let _ = server.wait();
    let _ = std::fs::remove_dir_all(&root);
}
