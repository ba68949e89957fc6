//! Which waiting attempt a cycle takes first in each pool because it has waited too long: shared by
//! [`crate::schedule`], which takes it first and holds nodes for it, and the control loop, which looks at it
//! again in every cycle (parked or not) and plans again when the next one comes due.

use crate::snapshot::{PoolIx, Snapshot};
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// Per pool, the starving attempt (an index into `snap.pending`): of the attempts waiting at least
/// `starvation_after_ms` at `now_ms`, without nominated nodes (a preemptor goes first anyway), and not
/// `passed_over`, the highest priority, then the oldest, then the lowest id. Aging must not turn priority
/// upside down: a low-priority task does not jump a waiting high-priority one.
///
/// `passed_over` lets a caller leave some attempts out of the choice (the control loop passes over the
/// extra workers of an autoscaling task, which are not queued tasks); the scheduler passes over none.
pub fn starving(
    snap: &Snapshot,
    now_ms: u64,
    starvation_after_ms: u64,
    passed_over: impl Fn(usize) -> bool,
) -> BTreeMap<PoolIx, usize> {
    let mut starving: BTreeMap<PoolIx, usize> = BTreeMap::new();
    for (i, a) in snap.pending.iter().enumerate() {
        if now_ms.saturating_sub(a.submitted_at_ms) < starvation_after_ms
            || !a.nominated.is_empty()
            || passed_over(i)
        {
            continue;
        }
        let e = starving.entry(a.pool).or_insert(i);
        let b = &snap.pending[*e];
        if (Reverse(a.priority), a.submitted_at_ms, a.id) < (Reverse(b.priority), b.submitted_at_ms, b.id) {
            *e = i;
        }
    }
    starving
}

/// When the clock alone next changes who is starving: the earliest time after `now_ms` at which an attempt
/// without nominated nodes reaches `starvation_after_ms` of waiting (`i64::MAX`: none will).
pub fn next_starving_at_ms(snap: &Snapshot, now_ms: i64, starvation_after_ms: u64) -> i64 {
    snap.pending
        .iter()
        .filter(|a| a.nominated.is_empty())
        .map(|a| a.submitted_at_ms.saturating_add(starvation_after_ms).min(i64::MAX as u64) as i64)
        .filter(|&at| at > now_ms)
        .min()
        .unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{AttemptId, NodeIx, PendingAttempt, SnapshotBuilder};
    use trainyard_core::spec::ResourceType;

    const THRESHOLD_MS: u64 = 1_000;

    /// (pool, priority, submitted at, nominated) of each pending attempt, ids in order from 1.
    fn snap(pending: &[(&str, u32, u64, bool)]) -> Snapshot {
        let mut b = SnapshotBuilder::new();
        let group = b.group("g");
        for (i, &(pool, priority, submitted_at_ms, nominated)) in pending.iter().enumerate() {
            let pool = b.pool(pool);
            b.pending(PendingAttempt {
                id: AttemptId(i as u64 + 1),
                name: format!("t{}", i + 1).into(),
                group,
                pool,
                resource_type: ResourceType::Reserved,
                guarantee: false,
                idle_supplement: false,
                priority,
                submitted_at_ms,
                options: Vec::new().into(),
                excluded: Vec::new(),
                nominated: if nominated { vec![NodeIx(0)] } else { Vec::new() },
            });
        }
        b.build()
    }

    /// The starving attempt of each pool at `now_ms`, by name, passing over the indexes in `passed_over`.
    fn check(pending: &[(&str, u32, u64, bool)], now_ms: u64, passed_over: &[usize], expected: &[&str]) {
        let s = snap(pending);
        let got: Vec<String> = starving(&s, now_ms, THRESHOLD_MS, |i| passed_over.contains(&i))
            .values()
            .map(|&i| s.pending[i].name.to_string())
            .collect();
        assert_eq!(got, expected, "{pending:?} at {now_ms}, passing over {passed_over:?}");
    }

    #[test]
    fn the_starving_pick() {
        // Nobody waited long enough; exactly the threshold is enough.
        check(&[("p", 5, 500, false)], 1_000, &[], &[]);
        check(&[("p", 5, 0, false)], 1_000, &[], &["t1"]);
        // Priority before age: an old low-priority task does not jump a younger high-priority one.
        check(&[("p", 1, 0, false), ("p", 9, 500, false)], 2_000, &[], &["t2"]);
        // Same priority: the oldest; same age: the lowest id.
        check(&[("p", 5, 300, false), ("p", 5, 200, false)], 2_000, &[], &["t2"]);
        check(&[("p", 5, 200, false), ("p", 5, 200, false)], 2_000, &[], &["t1"]);
        // A preemptor (nodes nominated) goes first anyway and is not the starving one.
        check(&[("p", 9, 0, false), ("p", 1, 0, false)], 2_000, &[], &["t1"]);
        check(&[("p", 9, 0, true), ("p", 1, 0, false)], 2_000, &[], &["t2"]);
        // One per pool.
        check(&[("a", 5, 0, false), ("b", 5, 0, false), ("a", 6, 0, false)], 2_000, &[], &["t3", "t2"]);
        // Passed over: the next best takes its place.
        check(&[("p", 9, 0, false), ("p", 1, 0, false)], 2_000, &[0], &["t2"]);
        check(&[("p", 9, 0, false)], 2_000, &[0], &[]);
    }

    #[test]
    fn the_next_starving_time() {
        let s = snap(&[("p", 5, 500, false), ("p", 5, 200, false), ("p", 5, 0, true)]);
        assert_eq!(next_starving_at_ms(&s, 1_000, THRESHOLD_MS), 1_200, "t2 first; t3 is nominated");
        assert_eq!(next_starving_at_ms(&s, 1_200, THRESHOLD_MS), 1_500, "strictly after now");
        assert_eq!(next_starving_at_ms(&s, 1_500, THRESHOLD_MS), i64::MAX, "all past it");
        assert_eq!(next_starving_at_ms(&s, 0, u64::MAX), i64::MAX, "a threshold past any time");
    }
}
