//! A seed replays exactly: two runs of a seed in one process leave the same log, tasks and events.

use super::Sim;

impl Sim {
    /// Everything a run leaves: the log of every step, then each task (deleted ones too) as the store holds
    /// it, with its events, in submission order.
    async fn outcome(&mut self) -> String {
        let mut out = std::mem::take(&mut self.trace);
        let store = self.control().store().clone();
        for id in &self.ids {
            let t = store.get_task(id).await.expect("the store reads");
            out.push_str(&format!("{t:?}\n"));
            for e in store.list_events(id, 0, 10_000).await.expect("the store reads") {
                out.push_str(&format!("  {e:?}\n"));
            }
        }
        out
    }
}

/// One seed's run and everything it left (see [`Sim::outcome`]).
fn outcome_of_seed(seed: u64, steps: u32) -> (Result<String, String>, String) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime starts");
    rt.block_on(async {
        let mut sim = Sim::new(seed).await;
        let result = sim.run(steps).await;
        (result, sim.outcome().await)
    })
}

/// A seed replays exactly: the same steps, ids, names, timestamps, events and tick reports, byte for byte.
/// (The two runs share one process, so ids drawn from the process's counters would differ.)
#[test]
fn a_seed_replays_exactly() {
    const REPLAY_SEEDS: [u64; 2] = [3, 11];
    const REPLAY_STEPS: u32 = 120;
    for seed in REPLAY_SEEDS {
        let (first, first_outcome) = outcome_of_seed(seed, REPLAY_STEPS);
        let (again, again_outcome) = outcome_of_seed(seed, REPLAY_STEPS);
        let summary = first.unwrap_or_else(|failure| panic!("{failure}"));
        assert_eq!(Ok(&summary), again.as_ref(), "seed {seed}: the summaries");
        assert!(first_outcome.lines().count() > REPLAY_STEPS as usize, "seed {seed} did little: {summary}");
        if first_outcome != again_outcome {
            let (a, b): (Vec<&str>, Vec<&str>) =
                (first_outcome.lines().collect(), again_outcome.lines().collect());
            let at = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            panic!(
                "seed {seed} did not replay exactly; first difference at line {at}:\n  {:?}\n  {:?}",
                a.get(at),
                b.get(at)
            );
        }
    }
}
