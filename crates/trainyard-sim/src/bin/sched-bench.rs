//! The scheduler benchmark. Prints, for this machine (one core: the scheduler is single-threaded):
//!
//! 1. throughput: 10,000 nodes of 8 GPUs, a queue of 50,000 gangs of 1–64 replicas with a three-spec
//!    fallback and mixed resource types, scheduled cycle after cycle (work finishing as it goes) until the
//!    queue is empty: replica placements per second of scheduler time, over the whole queue;
//! 2. one cycle over 1,000 pending gangs at 10,000 nodes, 70% full: p50 and p99;
//! 3. choosing victims for a 64-replica gang among 50,000 running replicas: p50 and p99 of the cycle;
//! 4. memory: resident memory of that snapshot and of scheduling it.
//!
//! Run: `cargo run --release -p trainyard-sim --bin sched-bench` (`-- --quick` for a smaller smoke run).

use std::time::{Duration, Instant};
use trainyard_core::spec::ResourceType;
use trainyard_sched::*;
use trainyard_sim::rng::Rng;
use trainyard_sim::workload::{self, Fleet};

struct Sizes {
    nodes: usize,
    queue: usize,
    cycle_pending: usize,
    cycle_runs: usize,
    victim_replicas: usize,
    victim_runs: usize,
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let sizes = if quick {
        Sizes {
            nodes: 1_000,
            queue: 5_000,
            cycle_pending: 1_000,
            cycle_runs: 20,
            victim_replicas: 5_000,
            victim_runs: 5,
        }
    } else {
        Sizes {
            nodes: 10_000,
            queue: 50_000,
            cycle_pending: 1_000,
            cycle_runs: 100,
            victim_replicas: 50_000,
            victim_runs: 20,
        }
    };
    println!("trainyard scheduler benchmark{}", if quick { " (quick)" } else { "" });
    println!("{:<58} {:>14} {:>16} {:>8}", "measure", "result", "target", "ratio");
    throughput(&sizes);
    cycle_latency(&sizes);
    victims(&sizes);
    memory(&sizes);
}

fn row(what: &str, result: String, target: &str, ratio: f64) {
    println!("{what:<58} {result:>14} {target:>16} {ratio:>8.2}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn percentile(mut xs: Vec<Duration>, p: f64) -> Duration {
    xs.sort();
    xs[((xs.len() as f64 - 1.0) * p).round() as usize]
}

fn throughput(sizes: &Sizes) {
    let fleet = workload::fleet(sizes.nodes, 50, 0.6);
    let mut rng = Rng::new(42);
    let mut pending: Vec<PendingAttempt> =
        (0..sizes.queue as u64).map(|i| workload::gang(&mut rng, &fleet, i, i)).collect();
    let originals = pending.clone();
    let mut running: Vec<(RunningAttempt, u64)> = Vec::new();
    let config = Config::default();
    let (mut sched_time, mut build_time) = (Duration::ZERO, Duration::ZERO);
    let (mut placed, mut admitted, mut preempted, mut cycles) = (0u64, 0u64, 0u64, 0u64);
    let mut slowest = Duration::ZERO;
    let mut last_reasons: Vec<String> = Vec::new();
    // Each cycle is one virtual minute; a gang runs 1 to 8 of them.
    const MAX_CYCLES: u64 = 100_000;
    while !pending.is_empty() && cycles < MAX_CYCLES {
        let now = cycles * 60_000 + 1_000_000;
        let t = Instant::now();
        let run: Vec<RunningAttempt> = running.iter().map(|(r, _)| r.clone()).collect();
        let snap = workload::snapshot(&fleet, &run, &pending);
        build_time += t.elapsed();
        let t = Instant::now();
        let plan = schedule(&snap, now, &config);
        let took = t.elapsed();
        sched_time += took;
        slowest = slowest.max(took);
        cycles += 1;
        // Preemptors keep the nodes chosen for them while their victims stop, as the control plane does.
        for w in plan.waits() {
            pending[w.pending_index].nominated = match &w.reason {
                WaitReason::Preempting { nodes, .. } => nodes.clone(),
                WaitReason::Blocked { .. } => Vec::new(),
            };
        }
        last_reasons = plan
            .waits()
            .take(5)
            .map(|w| {
                let a = &snap.pending[w.pending_index];
                let why = w.reason.describe(&snap, a.group, |id| format!("{id:?}"));
                format!("{} {} priority {}: {why}", a.name, a.resource_type, a.priority)
            })
            .collect();
        let mut done = vec![false; pending.len()];
        for adm in plan.admissions() {
            let a = &snap.pending[adm.pending_index];
            placed += adm.placements.len() as u64;
            admitted += 1;
            done[adm.pending_index] = true;
            running.push((workload::running_from(a, adm, now), cycles + rng.range(1, 8)));
        }
        // Preempted gangs go back to the queue as they were, with their place.
        let mut back = Vec::new();
        for p in plan.preemptions() {
            preempted += 1;
            if let Some(k) = running.iter().position(|(r, _)| r.id == p.victim) {
                running.swap_remove(k);
                back.push(originals[p.victim.0 as usize].clone());
            }
        }
        let mut i = 0;
        pending.retain(|_| {
            i += 1;
            !done[i - 1]
        });
        pending.extend(back);
        running.retain(|(_, end)| *end > cycles);
    }
    assert!(
        pending.is_empty(),
        "the queue did not drain in {MAX_CYCLES} cycles: {} gangs left, waiting because:\n  {}",
        pending.len(),
        last_reasons.join("\n  ")
    );
    let rate = placed as f64 / sched_time.as_secs_f64();
    row(
        &format!("throughput: {} gangs at {} nodes, replica placements/s", sizes.queue, sizes.nodes),
        format!("{rate:.0}"),
        "≥ 50000",
        rate / 50_000.0,
    );
    println!(
        "    {placed} replicas in {admitted} gangs over {cycles} cycles ({preempted} preempted); scheduler {:.2} s, slowest cycle {:.1} ms; snapshot building {:.2} s (not counted)",
        sched_time.as_secs_f64(),
        ms(slowest),
        build_time.as_secs_f64()
    );
}

fn cycle_latency(sizes: &Sizes) {
    let fleet = workload::fleet(sizes.nodes, 50, 0.6);
    let mut rng = Rng::new(7);
    let running = workload::fill(
        &mut rng,
        &fleet,
        0.7,
        &[ResourceType::Reserved, ResourceType::Spot, ResourceType::Idle],
        &[1, 2, 4, 8],
    );
    let config = Config::default();
    let mut times = Vec::with_capacity(sizes.cycle_runs);
    let mut admitted = 0;
    for run in 0..sizes.cycle_runs {
        let pending: Vec<PendingAttempt> = (0..sizes.cycle_pending as u64)
            .map(|i| workload::gang(&mut rng, &fleet, run as u64 * 1_000_000 + i, i))
            .collect();
        let snap = workload::snapshot(&fleet, &running, &pending);
        let t = Instant::now();
        let plan = schedule(&snap, 10_000_000, &config);
        times.push(t.elapsed());
        admitted += plan.admissions().count();
    }
    let replicas: usize = running.iter().map(|r| r.replicas.len()).sum();
    let p50 = percentile(times.clone(), 0.5);
    let p99 = percentile(times, 0.99);
    row(
        &format!("cycle: {} pending at {} nodes, p50 ms", sizes.cycle_pending, sizes.nodes),
        format!("{:.2}", ms(p50)),
        "",
        0.0,
    );
    row(
        &format!("cycle: {} pending at {} nodes, p99 ms", sizes.cycle_pending, sizes.nodes),
        format!("{:.2}", ms(p99)),
        "≤ 10",
        ms(p99) / 10.0,
    );
    println!(
        "    {} runs; fleet 70% full with {} running gangs ({replicas} replicas); {:.0} admitted per cycle on average",
        sizes.cycle_runs,
        running.len(),
        admitted as f64 / sizes.cycle_runs as f64
    );
}

/// A full fleet of preemptible and reserved work, and one 64-replica Reserved gang of whole nodes.
fn victims(sizes: &Sizes) {
    let (fleet, running, gang) = victim_scenario(sizes);
    let replicas: usize = running.iter().map(|r| r.replicas.len()).sum();
    let gpus_used: u64 = running.iter().flat_map(|r| &r.replicas).map(|x| x.need.gpus).sum();
    let mut times = Vec::with_capacity(sizes.victim_runs);
    let mut last_victims = 0;
    for run in 0..sizes.victim_runs {
        let mut gang = gang.clone();
        let mut options = gang.options.to_vec();
        options[0].roles[0].spec = fleet.specs[run % fleet.specs.len()];
        gang.options = options.into();
        let snap = workload::snapshot(&fleet, &running, std::slice::from_ref(&gang));
        let t = Instant::now();
        let plan = schedule(&snap, 1, &Config::default());
        times.push(t.elapsed());
        last_victims = plan.preemptions().count();
        assert!(
            plan.waits().any(|w| matches!(w.reason, WaitReason::Preempting { .. })),
            "the gang must find victims: {:?}",
            plan.waits().next().map(|w| &w.reason)
        );
    }
    let p50 = percentile(times.clone(), 0.5);
    let p99 = percentile(times, 0.99);
    let what = format!("victims: 64×8-GPU gang among {replicas} running replicas");
    row(&format!("{what}, p50 ms"), format!("{:.2}", ms(p50)), "", 0.0);
    row(&format!("{what}, p99 ms"), format!("{:.2}", ms(p99)), "≤ 10", ms(p99) / 10.0);
    println!(
        "    fleet {:.0}% of GPUs in use by {} running gangs; {last_victims} victims chosen",
        100.0 * gpus_used as f64 / (sizes.nodes as f64 * 8.0),
        running.len()
    );
}

/// A full fleet of preemptible and reserved work with `victim_replicas` replicas, and one 64-replica Reserved
/// gang of whole nodes whose group has the quota for it.
fn victim_scenario(sizes: &Sizes) -> (Fleet, Vec<RunningAttempt>, PendingAttempt) {
    let mut fleet: Fleet = workload::fleet(sizes.nodes, 50, 0.6);
    for &s in &fleet.specs {
        fleet.base.quotas.set(fleet.groups[0], ResourceType::Reserved, fleet.pool, s, 1_000_000);
    }
    let mut rng = Rng::new(11);
    let running = workload::fill(
        &mut rng,
        &fleet,
        1.0,
        &[ResourceType::Spot, ResourceType::Idle, ResourceType::Reserved],
        // Replicas of 1 or 2 GPUs: a full fleet of 80,000 GPUs holds about 50,000 of them.
        &[1, 2],
    );
    // Trimming would free whole nodes (the last gangs placed sit together), so the fleet stays full and the
    // count is reported as it is.
    let replicas: usize = running.iter().map(|r| r.replicas.len()).sum();
    assert!(
        replicas >= sizes.victim_replicas,
        "only {replicas} running replicas; the scenario wants {}",
        sizes.victim_replicas
    );
    let gang = PendingAttempt {
        id: AttemptId(1 << 50),
        name: "big".into(),
        group: fleet.groups[0],
        pool: fleet.pool,
        resource_type: ResourceType::Reserved,
        guarantee: true,
        idle_supplement: false,
        priority: 10,
        submitted_at_ms: 0,
        options: vec![GangOption {
            roles: vec![Role { spec: fleet.specs[0], count_per_node: 8, replicas: 64 }],
        }]
        .into(),
        excluded: vec![],
        nominated: vec![],
    };
    (fleet, running, gang)
}

/// Counts heap bytes in use and their peak, so memory figures are the scheduler's own allocations rather than
/// resident-set deltas the allocator's reuse would hide.
mod counting {
    // The only unsafe code in the workspace: a global allocator must implement the unsafe `GlobalAlloc`
    // trait. It forwards every call to the system allocator unchanged and only adds atomic counters.
    #![allow(unsafe_code)]
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    pub struct Counting;
    static CURRENT: AtomicUsize = AtomicUsize::new(0);
    static PEAK: AtomicUsize = AtomicUsize::new(0);

    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded unchanged to the system allocator with the caller's layout.
            let p = unsafe { System.alloc(layout) };
            if !p.is_null() {
                let now = CURRENT.fetch_add(layout.size(), Relaxed) + layout.size();
                PEAK.fetch_max(now, Relaxed);
            }
            p
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from `alloc` above with this layout, as the GlobalAlloc contract requires.
            unsafe { System.dealloc(ptr, layout) };
            CURRENT.fetch_sub(layout.size(), Relaxed);
        }
    }

    pub fn current() -> usize {
        CURRENT.load(Relaxed)
    }
    pub fn peak() -> usize {
        PEAK.load(Relaxed)
    }
    pub fn reset_peak() {
        PEAK.store(CURRENT.load(Relaxed), Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: counting::Counting = counting::Counting;

/// Heap bytes of the victims scenario's snapshot, and the peak while scheduling it.
fn memory(sizes: &Sizes) {
    let (fleet, running, gang) = victim_scenario(sizes);
    let before = counting::current();
    let snap = workload::snapshot(&fleet, &running, std::slice::from_ref(&gang));
    let snapshot = counting::current() - before;
    counting::reset_peak();
    let plan = schedule(&snap, 1, &Config::default());
    let cycle = counting::peak() - before - snapshot;
    std::hint::black_box(&plan);
    let total = snapshot + cycle;
    row(
        &format!(
            "memory: snapshot of {} running replicas + one cycle, MB",
            running.iter().map(|r| r.replicas.len()).sum::<usize>()
        ),
        format!("{:.1}", total as f64 / 1e6),
        "≤ 200",
        total as f64 / 200e6,
    );
    println!(
        "    heap: snapshot {:.1} MB, scheduling it {:.1} MB more at peak",
        snapshot as f64 / 1e6,
        cycle as f64 / 1e6
    );
}
