//! The queue's order as the board shows it: where each waiting attempt stands, in the order a cycle takes
//! them once nothing more is admitted. A cycle takes preemptors whose victims are leaving first, then always
//! the next attempt of the project group with the smallest dominant share of the fleet (ties: the group whose
//! next attempt was submitted first, then the lower group index); within a group, higher priority first,
//! then submission time. [`fair_order`] walks that order over queues already sorted within their groups, and
//! [`dominant_shares`] gives each group's share after a plan's admissions.

use crate::plan::{Decision, Plan};
use crate::snapshot::Snapshot;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use trainyard_core::demand::Resources;

/// Each group's dominant share of the fleet's schedulable capacity (parts per million) once `plan`'s
/// admissions run: the running attempts' replicas and the admitted ones, by [`Snapshot::groups`] index.
pub fn dominant_shares(snap: &Snapshot, plan: &Plan) -> Vec<u64> {
    let mut used = vec![Resources::default(); snap.groups.len()];
    for a in &snap.running {
        for r in &a.replicas {
            used[a.group.ix()] = used[a.group.ix()] + r.need;
        }
    }
    for d in &plan.decisions {
        if let Decision::Admit(adm) = d
            && let Some(a) = snap.pending.get(adm.pending_index)
        {
            for p in &adm.placements {
                used[a.group.ix()] = used[a.group.ix()] + p.need;
            }
        }
    }
    let total = snap.nodes.iter().filter(|n| n.schedulable).fold(Resources::default(), |t, n| t + n.capacity);
    used.iter().map(|u| share_of(*u, total)).collect()
}

/// Dominant share in parts per million: the largest of the GPU, CPU and memory fractions.
pub(crate) fn share_of(used: Resources, total: Resources) -> u64 {
    let share = |x: u64, t: u64| x.saturating_mul(1_000_000).checked_div(t).unwrap_or(0);
    share(used.gpus, total.gpus)
        .max(share(used.vcpus, total.vcpus))
        .max(share(used.memory_mib, total.memory_mib))
}

/// One group's waiting attempts, in its own queue order, as [`fair_order`] reads them.
pub trait GroupQueue {
    /// How many attempts wait in the group.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// When the `k`-th was submitted.
    fn submitted_at_ms(&self, k: usize) -> u64;
    /// Whether the `k`-th is a preemptor whose victims are leaving (it goes before everyone).
    fn first(&self, k: usize) -> bool;
}

/// Walks the waiting attempts in the order a cycle takes them when nothing more is admitted: every
/// preemptor first (by group index, then queue order), then the fair order across groups with the shares
/// fixed. Calls `visit(group, k)` once per attempt, in that order. `groups[g]` pairs a group's share with its
/// queue; the group index used for ties is `g`.
pub fn fair_order<Q: GroupQueue>(groups: &[(u64, Q)], mut visit: impl FnMut(usize, usize)) {
    for (g, (_, q)) in groups.iter().enumerate() {
        for k in (0..q.len()).filter(|&k| q.first(k)) {
            visit(g, k);
        }
    }
    let mut cursor = vec![0usize; groups.len()];
    let next = |g: usize, from: usize| (from..groups[g].1.len()).find(|&k| !groups[g].1.first(k));
    let mut heap: BinaryHeap<Reverse<(u64, u64, usize)>> = BinaryHeap::with_capacity(groups.len());
    for (g, (share, q)) in groups.iter().enumerate() {
        if let Some(k) = next(g, 0) {
            cursor[g] = k;
            heap.push(Reverse((*share, q.submitted_at_ms(k), g)));
        }
    }
    while let Some(Reverse((share, _, g))) = heap.pop() {
        visit(g, cursor[g]);
        if let Some(k) = next(g, cursor[g] + 1) {
            cursor[g] = k;
            heap.push(Reverse((share, groups[g].1.submitted_at_ms(k), g)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Q(Vec<(u64, bool)>);

    impl GroupQueue for &Q {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn submitted_at_ms(&self, k: usize) -> u64 {
            self.0[k].0
        }
        fn first(&self, k: usize) -> bool {
            self.0[k].1
        }
    }

    fn walk(groups: &[(u64, &Q)]) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        fair_order(groups, |g, k| out.push((g, k)));
        out
    }

    #[test]
    fn the_smaller_share_goes_first_and_equal_shares_interleave_by_submission() {
        let a = Q(vec![(10, false), (30, false)]);
        let b = Q(vec![(20, false), (40, false)]);
        // Equal shares: the older head goes next.
        assert_eq!(walk(&[(0, &a), (0, &b)]), [(0, 0), (1, 0), (0, 1), (1, 1)]);
        // Shares fixed (nothing more is admitted): the smaller share's whole queue first.
        assert_eq!(walk(&[(500, &a), (100, &b)]), [(1, 0), (1, 1), (0, 0), (0, 1)]);
        // Same share and same head time: the lower group index.
        let c = Q(vec![(10, false)]);
        assert_eq!(walk(&[(0, &c), (0, &a)]), [(0, 0), (1, 0), (1, 1)]);
    }

    #[test]
    fn preemptors_go_before_everyone_and_are_walked_once() {
        let a = Q(vec![(10, false), (20, true), (30, false)]);
        let b = Q(vec![(5, true), (15, false)]);
        let order = walk(&[(0, &a), (0, &b)]);
        assert_eq!(order, [(0, 1), (1, 0), (0, 0), (1, 1), (0, 2)]);
    }

    #[test]
    fn empty_queues_are_skipped() {
        let a = Q(vec![]);
        let b = Q(vec![(1, false)]);
        assert_eq!(walk(&[(0, &a), (7, &b), (0, &a)]), [(1, 0)]);
    }
}
