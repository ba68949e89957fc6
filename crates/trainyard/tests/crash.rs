//! Durability under `kill -9`: clients submit continuously (each submission with its own idempotency key,
//! retried with the same key until it is acknowledged, as a careful client does) while the server is killed
//! with SIGKILL and restarted several times. Afterwards every acknowledged task exists, and no submission
//! created two.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TASK: &str = r#"{"apiVersion": "trainyard.dev/v1", "kind": "TrainingTask",
 "metadata": {"namePrefix": "crash", "projectGroup": "default"},
 "spec": {"type": "PyTorchJob", "placement": {"region": "local", "cluster": "local"},
  "environment": {"image": "host", "cmd": "python3 train.py"},
  "compute": {"resourceType": "Reserved", "pool": "default", "workers": 0, "instanceSpecs": [{"spec": "cpu.small"}]}}}"#;

fn start(dir: &std::path::Path, port: u16) -> Child {
    let mut child = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .args(["up", "--backend", "fake", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir)
        .env("TRAINYARD_FAKE_RUN_MS", "200")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Ready once it prints its API line.
    let out = child.stdout.take().unwrap();
    let mut lines = std::io::BufReader::new(out).lines();
    for line in lines.by_ref() {
        if line.unwrap().trim_start().starts_with("API:") {
            break;
        }
    }
    // Keep draining its output so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    child
}

#[test]
fn acknowledged_tasks_survive_sigkill_and_none_is_created_twice() {
    let dir = std::env::temp_dir().join(format!("trainyard-crash-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut server = start(&dir, port);
    let token = std::fs::read_to_string(dir.join("admin.token")).unwrap().trim().to_owned();
    let base = format!("http://127.0.0.1:{port}");

    let acked: Arc<Mutex<BTreeMap<String, String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (acked, stop, token, base) = (acked.clone(), stop.clone(), token.clone(), base.clone());
            std::thread::spawn(move || {
                let agent: ureq::Agent = ureq::Agent::config_builder()
                    .http_status_as_error(false)
                    .timeout_global(Some(Duration::from_secs(10)))
                    .build()
                    .into();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    let key = format!("client{c}-{n}");
                    // Retry this submission, with the same key, until the server acknowledges it.
                    let deadline = Instant::now() + Duration::from_secs(60);
                    loop {
                        let resp = agent
                            .post(&format!("{base}/api/v1/tasks"))
                            .header("Authorization", &format!("Bearer {token}"))
                            .header("Idempotency-Key", &key)
                            .send(TASK.as_bytes());
                        if let Ok(mut r) = resp
                            && matches!(r.status().as_u16(), 200 | 201)
                        {
                            let v: serde_json::Value =
                                serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
                            let id = v["id"].as_str().unwrap().to_owned();
                            let before = acked.lock().unwrap().insert(key.clone(), id.clone());
                            assert!(before.is_none_or(|b| b == id), "{key} acknowledged as two tasks");
                            break;
                        }
                        assert!(Instant::now() < deadline, "{key} was never acknowledged");
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    n += 1;
                }
            })
        })
        .collect();

    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(1500));
        server.kill().unwrap(); // SIGKILL
        server.wait().unwrap();
        server = start(&dir, port);
    }
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    server.kill().unwrap();
    server.wait().unwrap();

    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 20, "the clients got too few submissions through: {}", acked.len());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let store =
            trainyard_store::Store::connect(&format!("sqlite://{}", dir.join("trainyard.db").display()))
                .await
                .unwrap();
        for (key, id) in &acked {
            assert!(store.get_task(id).await.unwrap().is_some(), "acknowledged {key} ({id}) was lost");
        }
        // Every stored task was acknowledged under exactly one key: nothing created twice.
        assert_eq!(store.count_tasks().await.unwrap() as usize, acked.len());
    });
    let _ = std::fs::remove_dir_all(&dir);
}
