//! Which of several servers on one store leads, as `GET /api/v1/server` says it.

use super::Server;
use serde_json::Value;
use std::time::{Duration, Instant};

/// `GET /api/v1/server` from `s`, if it answers.
pub fn status(s: &Server) -> Option<Value> {
    let resp = super::agent()
        .get(format!("{}/api/v1/server", s.base))
        .header("Authorization", &format!("Bearer {}", s.token))
        .call()
        .ok()?;
    let mut resp = resp;
    if resp.status() != 200 {
        return None;
    }
    serde_json::from_str(&resp.body_mut().read_to_string().ok()?).ok()
}

/// The index of the server that leads now, as any live server sees it.
pub fn leader(all: &[Server]) -> Option<usize> {
    for s in all.iter().filter(|s| s.pid().is_some()) {
        let Some(v) = status(s) else { continue };
        if v["leader"]["live"] != true {
            return None;
        }
        let id = v["leader"]["server"].as_str()?;
        let address =
            v["servers"].as_array()?.iter().find(|x| x["id"] == id)?["address"].as_str()?.to_owned();
        return all.iter().position(|s| s.base == address && s.pid().is_some());
    }
    None
}

/// Waits until a live server leads: its index.
pub fn wait_leader(all: &[Server], within: Duration) -> usize {
    let t0 = Instant::now();
    loop {
        if let Some(i) = leader(all) {
            return i;
        }
        assert!(t0.elapsed() < within, "no server leads after {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
