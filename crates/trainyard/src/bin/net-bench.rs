//! The replica network's start-up cost on the local backend: an attempt's switch namespace, then each
//! replica's network namespace wired to it (its macvlan link, address, links up), made at once from one
//! thread per replica as the replicas' supervisors make them, timed until the last is ready. The kernel part
//! of a gang's start, without processes, cgroups or the server.
//!
//!   cargo run --release -p trainyard --bin net-bench [-- --runs N --replicas R]
//!
//! As root. Each run's namespaces are let go as the next run starts, so the kernel takes the last one down
//! while the next is made, as on a machine where tasks end while others start.

use std::time::Instant;
use trainyard_local::netns;

fn arg(name: &str, default: usize) -> usize {
    std::env::args().skip_while(|a| a != name).nth(1).and_then(|n| n.parse().ok()).unwrap_or(default)
}

#[path = "shared/stats.rs"]
mod stats;
use stats::percentile;

fn main() {
    let (runs, replicas) = (arg("--runs", 40), arg("--replicas", 8));
    let ip = netns::find_ip().unwrap_or_else(|e| panic!("{e}"));
    let range = netns::Range::default();
    let mut ms = Vec::with_capacity(runs);
    for run in 0..runs {
        let switch = netns::attempt_name(&format!("net-bench-{}", std::process::id()), run as i64);
        let t0 = Instant::now();
        netns::create_switch(&ip, &switch, None).unwrap_or_else(|e| panic!("the switch: {e}"));
        let fds: Vec<_> = std::thread::scope(|s| {
            let made: Vec<_> = (0..replicas)
                .map(|i| {
                    let net = netns::ReplicaNet {
                        switch: switch.clone(),
                        name: format!("{switch}-{i}"),
                        address: range.address(i).expect("the range holds a gang"),
                        prefix: range.prefix,
                        gateway: None,
                    };
                    s.spawn(move || netns::create_replica(&net))
                })
                .collect();
            made.into_iter().map(|h| h.join().expect("no panic").unwrap_or_else(|e| panic!("{e}"))).collect()
        });
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        drop(fds);
        netns::delete_switch(&ip, &switch);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "switch + {replicas} replica networks, {runs} runs: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        percentile(&ms, 0.5),
        percentile(&ms, 0.9),
        percentile(&ms, 0.99),
        ms[ms.len() - 1]
    );
}
