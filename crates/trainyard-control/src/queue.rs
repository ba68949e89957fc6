//! The queue between scheduling cycles: every waiting task, per project group in queue order, with the place
//! and reason the board shows, so that a cycle which only takes in new arrivals costs what arrived, not the
//! depth of the queue.
//!
//! Why a waiting task can be left out of such a cycle (it is *parked*): within a cycle, and from one cycle to
//! the next while nothing but queued arrivals changed, capacity and quota only get used up, never freed.
//! Nothing that blocked a task (its quota, room on the nodes, nodes held for others) can have cleared, and no
//! running task appeared that it could preempt but did not: an admission is a change that makes the next plan
//! a full one. A parked task would come out of a cycle waiting, for the same reason, and without changing
//! what the cycle decides for anyone else. What a cycle always looks at again: preemptors whose victims are
//! leaving, and each pool's starving task (both are taken first and may hold nodes), listed by the plan as
//! `unparked`.
//!
//! The board's places are worked out here for every waiting task on each plan, by [`fair_order`]: the order a
//! cycle takes waiting tasks once nothing more is admitted (preemptors first, then the fair order across
//! groups). Only the places that moved are written to the board.

use crate::handles::QueueInfo;
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::sync::Arc;
use trainyard_sched::{GroupQueue, fair_order};

/// One waiting task as the queue keeps it.
#[derive(Debug, Clone)]
pub(crate) struct Waiting {
    pub(crate) id: Arc<str>,
    pub(crate) priority: u32,
    pub(crate) submitted_at_ms: i64,
    pub(crate) reason: Arc<str>,
    /// A preemptor whose victims are leaving: first in line.
    pub(crate) preempting: bool,
    /// The place last put on the board (0: not on it yet, or its reason changed since).
    position: u32,
    position_in_group: u32,
}

impl Waiting {
    pub(crate) fn new(
        id: Arc<str>,
        priority: u32,
        submitted_at_ms: i64,
        reason: Arc<str>,
        preempting: bool,
    ) -> Self {
        Waiting { id, priority, submitted_at_ms, reason, preempting, position: 0, position_in_group: 0 }
    }

    /// Queue order within a group: higher priority first, then submission time, then id (as the cycle).
    fn key(&self) -> (Reverse<u32>, i64, &str) {
        (Reverse(self.priority), self.submitted_at_ms, &self.id)
    }
}

/// Every waiting task, per project group (by name: the scheduler's group order) in queue order.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    groups: BTreeMap<String, Vec<Waiting>>,
    len: usize,
}

/// One group's waiting tasks, as [`fair_order`] reads them.
struct Lane<'a>(&'a [Waiting]);

impl GroupQueue for Lane<'_> {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn submitted_at_ms(&self, k: usize) -> u64 {
        self.0[k].submitted_at_ms.max(0) as u64
    }
    fn first(&self, k: usize) -> bool {
        self.0[k].preempting
    }
}

impl Queue {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The whole queue anew (a full plan's waits).
    pub(crate) fn rebuild(&mut self, waiting: impl IntoIterator<Item = (String, Waiting)>) {
        self.groups.clear();
        self.len = 0;
        for (group, w) in waiting {
            self.groups.entry(group).or_default().push(w);
            self.len += 1;
        }
        for q in self.groups.values_mut() {
            q.sort_by(|a, b| a.key().cmp(&b.key()));
        }
    }

    /// Puts a task in its place, or updates it there (a task a cycle looked at again).
    pub(crate) fn upsert(&mut self, group: &str, w: Waiting) {
        let q = match self.groups.get_mut(group) {
            Some(q) => q,
            None => self.groups.entry(group.to_owned()).or_default(),
        };
        match q.binary_search_by(|x| x.key().cmp(&w.key())) {
            Ok(k) => {
                let known = &mut q[k];
                if known.reason != w.reason || known.preempting != w.preempting {
                    *known = w;
                }
            }
            Err(k) => {
                q.insert(k, w);
                self.len += 1;
            }
        }
    }

    /// Takes a task out (admitted); whether it was there.
    pub(crate) fn remove(&mut self, group: &str, priority: u32, submitted_at_ms: i64, id: &str) -> bool {
        let Some(q) = self.groups.get_mut(group) else { return false };
        let key = (Reverse(priority), submitted_at_ms, id);
        match q.binary_search_by(|x| x.key().cmp(&key)) {
            Ok(k) => {
                q.remove(k);
                self.len -= 1;
                true
            }
            Err(_) => false,
        }
    }

    /// Takes out every task `gone` names (tasks that left the working set while queued).
    pub(crate) fn remove_all(&mut self, gone: &std::collections::HashSet<&str>) {
        for q in self.groups.values_mut() {
            q.retain(|w| !gone.contains(&*w.id));
        }
        self.len = self.groups.values().map(Vec::len).sum();
    }

    /// Works out every task's place (see the module's header) with each group's share of the fleet, and
    /// calls `moved` for each task whose place or reason differs from what the board has.
    pub(crate) fn place(&mut self, share: impl Fn(&str) -> u64, mut moved: impl FnMut(&Arc<str>, QueueInfo)) {
        self.groups.retain(|_, q| !q.is_empty());
        let mut places: Vec<Vec<u32>> = self.groups.values().map(|q| vec![0; q.len()]).collect();
        {
            let groups: Vec<(u64, Lane)> =
                self.groups.iter().map(|(name, q)| (share(name), Lane(q))).collect();
            let mut next = 0u32;
            fair_order(&groups, |g, k| {
                next += 1;
                places[g][k] = next;
            });
        }
        for (q, places) in self.groups.values_mut().zip(places) {
            for ((k, w), position) in q.iter_mut().enumerate().zip(places) {
                let position_in_group = k as u32 + 1;
                if (w.position, w.position_in_group) != (position, position_in_group) {
                    w.position = position;
                    w.position_in_group = position_in_group;
                    moved(&w.id, QueueInfo { position, position_in_group, reason: w.reason.clone() });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(id: &str, priority: u32, at: i64) -> Waiting {
        Waiting::new(id.into(), priority, at, "full".into(), false)
    }

    fn board(q: &mut Queue, shares: &[(&str, u64)]) -> Vec<(String, u32, u32)> {
        let mut out = Vec::new();
        q.place(
            |g| shares.iter().find(|(n, _)| *n == g).map_or(0, |s| s.1),
            |id, info| out.push((id.to_string(), info.position, info.position_in_group)),
        );
        out.sort_by_key(|x| x.1);
        out
    }

    #[test]
    fn places_follow_priority_then_submission_and_only_moves_are_reported() {
        let mut q = Queue::default();
        q.rebuild([("a".into(), w("t2", 0, 20)), ("a".into(), w("t1", 0, 10)), ("a".into(), w("t3", 5, 30))]);
        assert_eq!(
            board(&mut q, &[]),
            [("t3".into(), 1, 1), ("t1".into(), 2, 2), ("t2".into(), 3, 3)],
            "higher priority first"
        );
        // An arrival at the end moves nobody else.
        q.upsert("a", w("t4", 0, 40));
        assert_eq!(board(&mut q, &[]), [("t4".into(), 4, 4)]);
        // A higher-priority arrival moves everyone behind it.
        q.upsert("a", w("t5", 9, 50));
        assert_eq!(q.len(), 5);
        let moved = board(&mut q, &[]);
        assert_eq!(moved.len(), 5, "{moved:?}");
        assert_eq!(moved[0], ("t5".into(), 1, 1));
        // Taken out (admitted): those behind move up.
        assert!(q.remove("a", 9, 50, "t5"));
        assert!(!q.remove("a", 9, 50, "t5"));
        assert_eq!(board(&mut q, &[]).len(), 4);
        // A reason that changed is reported even in the same place.
        q.upsert("a", Waiting::new("t4".into(), 0, 40, "other".into(), false));
        let mut reported = Vec::new();
        q.place(|_| 0, |id, info| reported.push((id.to_string(), info.reason.to_string())));
        assert_eq!(reported, [("t4".to_owned(), "other".to_owned())]);
    }

    #[test]
    fn groups_interleave_by_share_and_preemptors_go_first() {
        let mut q = Queue::default();
        q.rebuild([
            ("a".into(), w("a1", 0, 10)),
            ("a".into(), w("a2", 0, 30)),
            ("b".into(), w("b1", 0, 20)),
            ("b".into(), Waiting::new("b2".into(), 0, 40, "preempting".into(), true)),
        ]);
        let order: Vec<String> = board(&mut q, &[("a", 0), ("b", 0)]).into_iter().map(|x| x.0).collect();
        assert_eq!(order, ["b2", "a1", "b1", "a2"]);
        let gone: std::collections::HashSet<&str> = ["a1"].into();
        q.remove_all(&gone);
        assert_eq!(q.len(), 3);
        // Group b now has the larger share: a's queue goes first.
        let order: Vec<String> = board(&mut q, &[("a", 0), ("b", 10)]).into_iter().map(|x| x.0).collect();
        assert_eq!(order, ["a2"], "b2 and b1 kept their places; only a moved task is reported");
    }
}
