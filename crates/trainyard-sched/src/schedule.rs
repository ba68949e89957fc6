//! One scheduling cycle: `schedule(&Snapshot, now, &Config) -> Plan`.
//!
//! 1. Order the queue: within a project group by priority (higher first), then submission time, then id;
//!    across groups fairly, always taking the next task of the group with the smallest dominant share of the
//!    fleet (running plus admitted this cycle).
//! 2. Before that order: first every attempt with nominated nodes (a preemptor whose victims are leaving; its
//!    nodes are held for it from the start of the cycle), so what its victims free is not taken back by them;
//!    then, per pool, the highest-priority, oldest attempt that has waited longer than
//!    [`Config::starvation_after_ms`]; if it cannot start, the nodes closest to fitting it are held for it, so a
//!    stream of small tasks cannot starve a large gang forever (they still fill other nodes).
//! 3. For each attempt, try its instance-spec options in the user's order: the quota check for its resource
//!    type, then a gang placement (every replica on one matching node, or none). The first that fits wins.
//! 4. If none fits and the attempt runs on non-preemptible capacity, look for victims (see [`crate::preempt`]):
//!    if some set of them makes it fit, they are preempted and the nodes are held for it; otherwise nothing is
//!    preempted.
//! 5. Everything else waits, with a reason per option and its position in the queue.

use crate::plan::*;
use crate::preempt::{Cx, choose_victims};
use crate::quota::{check_quota, option_units};
use crate::snapshot::*;
use crate::starving::starving;
use crate::state::{NoFit, State, units_in};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use trainyard_core::demand::Resources;
use trainyard_core::spec::ResourceType;

/// Scheduler settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// An attempt queued longer than this goes first in its pool and gets nodes held for it.
    pub starvation_after_ms: u64,
    /// Whether non-preemptible attempts may preempt others.
    pub preemption: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config { starvation_after_ms: 5 * 60 * 1000, preemption: true }
    }
}

/// Whether an attempt with these uses may preempt others: it runs only on capacity that is never taken away.
fn non_preemptible(uses: &[UnitUse]) -> bool {
    uses.iter().all(|u| !u.class.preemptible())
}

/// What happened to one attempt in the pass.
enum Outcome {
    Admitted,
    Preempting(Vec<usize>, Vec<NodeIx>),
    Waiting(Vec<OptionReason>),
}

/// Runs one scheduling cycle.
pub fn schedule(snap: &Snapshot, now_ms: u64, config: &Config) -> Plan {
    let mut st = State::new(snap);
    let mut plan = Plan::default();
    let mut cx = Cx::new(snap);

    // Queue order within each group.
    let mut per_group: Vec<Vec<usize>> = vec![Vec::new(); snap.groups.len()];
    for (i, a) in snap.pending.iter().enumerate() {
        per_group[a.group.ix()].push(i);
    }
    for q in &mut per_group {
        q.sort_by_key(|&i| {
            let a = &snap.pending[i];
            (Reverse(a.priority), a.submitted_at_ms, a.id)
        });
    }
    let mut position_in_group = vec![0u32; snap.pending.len()];
    for q in &per_group {
        for (k, &i) in q.iter().enumerate() {
            position_in_group[i] = k as u32 + 1;
        }
    }

    // Nodes nominated for preemptors in earlier cycles are theirs first, in queue order.
    for q in &per_group {
        for &i in q {
            if !snap.pending[i].nominated.is_empty() {
                st.hold(i, snap.pending[i].nominated.iter().copied());
            }
        }
    }

    // Starving attempts: per pool, past the threshold, the highest priority and then the oldest.
    let starving = starving(snap, now_ms, config.starvation_after_ms, |_| false);

    let mut shares = Shares::new(snap);
    let mut order: Vec<usize> = Vec::with_capacity(snap.pending.len());
    let mut outcomes: Vec<Option<Outcome>> = (0..snap.pending.len()).map(|_| None).collect();
    // First the preemptors whose victims are leaving: what their victims free (nodes and quota) is theirs, or
    // the victims, requeued, would take it back and be preempted again, for ever. Then the starving.
    let nominated = per_group.iter().flatten().copied().filter(|&i| !snap.pending[i].nominated.is_empty());
    let first: Vec<(usize, bool)> =
        nominated.map(|i| (i, false)).chain(starving.values().map(|&i| (i, true))).collect();
    for (i, is_starving) in first {
        let out = process(&mut st, &mut plan, &mut cx, i, config, is_starving);
        if matches!(out, Outcome::Admitted) {
            shares.admit(&snap.pending[i], &plan);
        }
        outcomes[i] = Some(out);
        order.push(i);
    }

    // Fair order across groups: the group with the smallest share goes next.
    let mut cursor = vec![0usize; per_group.len()];
    let mut heap: BinaryHeap<Reverse<(u64, u64, u16)>> = BinaryHeap::new();
    let head = |g: usize, cursor: &[usize], outcomes: &[Option<Outcome>]| -> Option<usize> {
        per_group[g][cursor[g]..].iter().position(|&i| outcomes[i].is_none()).map(|k| cursor[g] + k)
    };
    for g in 0..per_group.len() {
        if let Some(k) = head(g, &cursor, &outcomes) {
            cursor[g] = k;
            let a = &snap.pending[per_group[g][k]];
            heap.push(Reverse((shares.of(g), a.submitted_at_ms, g as u16)));
        }
    }
    while let Some(Reverse((_, _, g))) = heap.pop() {
        let g = g as usize;
        let i = per_group[g][cursor[g]];
        let out = process(&mut st, &mut plan, &mut cx, i, config, false);
        if matches!(out, Outcome::Admitted) {
            shares.admit(&snap.pending[i], &plan);
        }
        outcomes[i] = Some(out);
        order.push(i);
        cursor[g] += 1;
        if let Some(k) = head(g, &cursor, &outcomes) {
            cursor[g] = k;
            let a = &snap.pending[per_group[g][k]];
            heap.push(Reverse((shares.of(g), a.submitted_at_ms, g as u16)));
        }
    }

    // Wait decisions, with figures from the final state of the cycle.
    let mut figures = Figures::default();
    for (pos, &i) in order.iter().enumerate() {
        let a = &snap.pending[i];
        let reason = match outcomes[i].take().expect("every pending attempt was processed once") {
            Outcome::Admitted => continue,
            Outcome::Preempting(victims, nodes) => WaitReason::Preempting {
                victims: victims.iter().map(|&v| snap.running[v].id).collect(),
                nodes,
            },
            Outcome::Waiting(mut per_option) => {
                for r in &mut per_option {
                    if let OptionBlock::NoFit { fit_now, largest_free, need, .. } = &mut r.block {
                        let model = snap.specs[r.spec.ix()].model;
                        (*fit_now, *largest_free) = figures.fit(&st, a.pool, model, *need, &a.excluded);
                    }
                }
                WaitReason::Blocked { options: per_option }
            }
        };
        plan.decisions.push(Decision::Wait(Wait {
            attempt: a.id,
            pending_index: i,
            reason,
            position: pos as u32 + 1,
            position_in_group: position_in_group[i],
        }));
    }
    plan
}

/// Tries one attempt: every option without preemption, then with it.
fn process(
    st: &mut State,
    plan: &mut Plan,
    cx: &mut Cx,
    i: usize,
    config: &Config,
    starving: bool,
) -> Outcome {
    let snap = st.snap;
    let a = &snap.pending[i];
    let mut reasons: Vec<OptionReason> = Vec::with_capacity(a.options.len());
    // Options that may preempt: non-preemptible ones that passed quota, and Reserved ones short of their own
    // quota while lower-priority work of their group runs.
    let mut preemptable: Vec<(usize, Option<QuotaShort>)> = Vec::new();
    // The first option its quota allows that only lacks room: the one a starving attempt holds nodes for.
    let mut roomless: Option<usize> = None;
    for (oi, option) in a.options.iter().enumerate() {
        let uses = match check_quota(st, a, option) {
            Ok(u) => u,
            Err(short) => {
                // A Reserved attempt short of its own quota may preempt lower-priority work of its group.
                if matches!(short, QuotaShort::Quota { resource_type: ResourceType::Reserved, .. })
                    && cx.same_group_possible(a)
                {
                    preemptable.push((oi, Some(short)));
                }
                reasons.push(OptionReason {
                    option: oi,
                    spec: short.spec(),
                    block: OptionBlock::Quota(short),
                });
                continue;
            }
        };
        match st.place_gang(a, i, option, false) {
            Ok(placed) => {
                st.add_usage(a.group, a.pool, &uses);
                st.unhold(i);
                let preemptible = !non_preemptible(&uses);
                plan.decisions.push(Decision::Admit(Admission {
                    attempt: a.id,
                    pending_index: i,
                    option: oi,
                    placements: placed
                        .into_iter()
                        .map(|(role, replica, node, need)| Placement { role, replica, node, need })
                        .collect(),
                    units: uses,
                    preemptible,
                }));
                return Outcome::Admitted;
            }
            Err(NoFit { role, need, .. }) => {
                roomless.get_or_insert(oi);
                let spec = option.roles[role].spec;
                let block = match behind(st, a, i, option) {
                    Some(holder) => OptionBlock::Behind {
                        holder: snap.pending[holder].id,
                        name: snap.pending[holder].name.to_string(),
                    },
                    None => OptionBlock::NoFit {
                        role,
                        need,
                        replicas: option.roles[role].replicas,
                        fit_now: 0,
                        largest_free: None,
                    },
                };
                reasons.push(OptionReason { option: oi, spec, block });
                if non_preemptible(&uses) {
                    preemptable.push((oi, None));
                }
            }
        }
    }
    if config.preemption {
        for (oi, short) in preemptable {
            let option = &a.options[oi];
            if !cx.worth_searching(st, a, option) {
                continue;
            }
            if let Some(choice) = choose_victims(st, cx, a, i, option, short.as_ref()) {
                st.hold(i, choice.nodes.iter().copied());
                hold_quota(st, a, option);

                for &v in &choice.victims {
                    if !snap.running[v].stopping && !cx.doomed[v] {
                        cx.doomed[v] = true;
                        plan.decisions.push(Decision::Preempt(Preemption {
                            victim: snap.running[v].id,
                            running_index: v,
                            preemptor: a.id,
                        }));
                    }
                }
                return Outcome::Preempting(choice.victims, choice.nodes);
            }
        }
    }
    // Holding nodes for an attempt its quota refuses would keep them from everyone for as long as the quota
    // stays short, possibly for ever: only room is waited for.
    if starving && let Some(oi) = roomless {
        hold_for_starving(st, a, i, &a.options[oi]);
    }
    Outcome::Waiting(reasons)
}

/// Keeps, for the rest of the cycle, the quota a preemptor counted on, so attempts after it cannot use it
/// up while its victims stop (it would then need more victims next cycle, and so on). Its units are counted
/// as in use; Reserved ones only up to what the group has left (the victims free the rest).
fn hold_quota(st: &mut State, a: &PendingAttempt, option: &GangOption) {
    let class = match a.resource_type {
        ResourceType::Reserved => UsageClass::Reserved,
        ResourceType::Ondemand => UsageClass::Ondemand,
        ResourceType::Spot | ResourceType::Idle => return,
    };
    let mut held = Vec::new();
    for (s, u) in option_units(option) {
        let units = match a.resource_type {
            ResourceType::Reserved => {
                let limit = st.snap.quotas.limit(a.group, ResourceType::Reserved, a.pool, s).unwrap_or(0);
                u.min(limit.saturating_sub(st.group_used(a.group, UsageClass::Reserved, a.pool, s)))
            }
            _ => u,
        };
        if units > 0 {
            held.push(UnitUse { spec: s, class, units });
        }
    }
    st.add_usage(a.group, a.pool, &held);
}

/// If the attempt fits once holds are ignored, the holder it waits behind.
fn behind(st: &mut State, a: &PendingAttempt, i: usize, option: &GangOption) -> Option<usize> {
    if st.holders.iter().all(|&h| h as usize == i + 1) {
        return None;
    }
    let placed = st.place_gang(a, i, option, true).ok()?;
    let holder =
        placed.iter().map(|&(_, _, n, _)| st.holder[n.ix()]).find(|&h| h != 0 && h as usize != i + 1);
    st.rollback(&placed);
    holder.map(|h| h as usize - 1)
}

/// Holds, for a starving attempt that cannot start, the nodes closest to fitting each replica of `option`,
/// so nothing new lands there and the gang starts as soon as they drain. Nothing is held when the pool could
/// not take the gang even empty (too few nodes its replicas fit on): it would wait, and block others, for
/// ever.
fn hold_for_starving(st: &mut State, a: &PendingAttempt, i: usize, option: &GangOption) {
    let mut chosen: Vec<NodeIx> = Vec::new();
    for role in &option.roles {
        let need = st.snap.replica_need(role);
        let model = st.snap.specs[role.spec.ix()].model;
        let Some(gi) = st.group_index(a.pool, model) else { continue };
        // The nodes with the most free room of the scarce dimension, not held by anyone else.
        let mut picked = 0;
        'outer: for bucket in st.groups[gi].buckets.iter().rev() {
            for &n in bucket {
                if picked == role.replicas {
                    break 'outer;
                }
                let cap = st.snap.nodes[n.ix()].capacity;
                if st.holder[n.ix()] == 0
                    && !a.excluded.contains(&n)
                    && need.fits_in(&cap)
                    && !chosen.contains(&n)
                {
                    chosen.push(n);
                    picked += 1;
                }
            }
        }
        // Too few nodes in the pool its replicas fit on, held or not: it could not start even on an empty
        // pool, so nothing is held for it.
        let could_fit = st.groups[gi]
            .buckets
            .iter()
            .flatten()
            .filter(|&&n| !a.excluded.contains(&n) && need.fits_in(&st.snap.nodes[n.ix()].capacity))
            .count();
        if could_fit < role.replicas as usize {
            return;
        }
    }
    st.hold(i, chosen);
}

/// Dominant shares of the fleet per group, for the fair order.
struct Shares {
    used: Vec<Resources>,
    total: Resources,
}

impl Shares {
    fn new(snap: &Snapshot) -> Self {
        let mut used = vec![Resources::default(); snap.groups.len()];
        for a in &snap.running {
            for r in &a.replicas {
                used[a.group.ix()] = used[a.group.ix()] + r.need;
            }
        }
        let total =
            snap.nodes.iter().filter(|n| n.schedulable).fold(Resources::default(), |t, n| t + n.capacity);
        Shares { used, total }
    }

    fn admit(&mut self, a: &PendingAttempt, plan: &Plan) {
        if let Some(Decision::Admit(adm)) = plan.decisions.last() {
            for p in &adm.placements {
                self.used[a.group.ix()] = self.used[a.group.ix()] + p.need;
            }
        }
    }

    /// Dominant share in parts per million.
    fn of(&self, g: usize) -> u64 {
        crate::order::share_of(self.used[g], self.total)
    }
}

/// "How many replicas of this size fit now, and the largest free block", computed once per (group, need).
type FitKey = (PoolIx, Option<ModelIx>, u64, u64, u64);

#[derive(Default)]
struct Figures {
    /// (pool, model, need) -> (replicas that fit, largest free block).
    cache: BTreeMap<FitKey, (u64, Option<Resources>)>,
}

impl Figures {
    fn fit(
        &mut self,
        st: &State,
        pool: PoolIx,
        model: Option<ModelIx>,
        need: Resources,
        excluded: &[NodeIx],
    ) -> (u64, Option<Resources>) {
        let compute = || {
            let Some(gi) = st.group_index(pool, model) else { return (0, None) };
            let mut fit = 0u64;
            let mut largest: Option<Resources> = None;
            for &n in st.groups[gi].buckets.iter().flatten().filter(|n| !excluded.contains(n)) {
                let f = st.free[n.ix()];
                fit = units_in(f, need).saturating_add(fit);
                if largest.is_none_or(|l| (f.gpus, f.vcpus, f.memory_mib) > (l.gpus, l.vcpus, l.memory_mib)) {
                    largest = Some(f);
                }
            }
            (fit, largest)
        };
        if !excluded.is_empty() {
            return compute();
        }
        *self.cache.entry((pool, model, need.gpus, need.vcpus, need.memory_mib)).or_insert_with(compute)
    }
}
