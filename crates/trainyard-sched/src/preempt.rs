//! Choosing victims for a non-preemptible attempt that does not fit.
//!
//! Who may be preempted, cheapest first:
//! 0. attempts already stopping (they are leaving anyway; counting on them costs nothing);
//! 1. Spot attempts;
//! 2. Idle attempts and Reserved attempts running partly on borrowed idle capacity;
//! 3. for a Reserved attempt only: lower-priority Reserved attempts of its own group (within the group's own
//!    reserved quota).
//!
//! The search works on the real state of the cycle and undoes everything before returning:
//! first the quota (for a Reserved attempt short of its own quota, the lowest-priority, newest attempts of its
//! group until the shortfall is covered), then the nodes (replica by replica, the node where the cheapest set
//! of victims makes room), then a reprieve pass that puts back every victim the gang can do without. A set is
//! returned only if the gang really fits once the victims are gone: never preempt and then fail to place.

use crate::schedule::{check_quota, option_units};
use crate::snapshot::*;
use crate::state::{Placed, State};
use trainyard_core::demand::Resources;
use trainyard_core::spec::ResourceType;

/// The victims (indexes into `Snapshot::running`) and the nodes the gang will use.
#[derive(Debug)]
pub(crate) struct VictimChoice {
    pub victims: Vec<usize>,
    pub nodes: Vec<NodeIx>,
}

/// Searches for victims per cycle are bounded: a search costs far more than a placement, and the attempts
/// that did not get one this cycle get one in a later cycle.
pub const MAX_PREEMPTION_SEARCHES_PER_CYCLE: usize = 64;
/// Remembered failed searches per cycle.
const FAILURE_MEMO_MAX: usize = 64;

/// Cost of preempting one attempt of each rank. Each rank outweighs any number of victims of the ranks
/// below it that one gang could need; within a rank, [`loss`] breaks ties towards the smaller loss.
const WEIGHT: [u64; 4] = [0, 1 << 24, 1 << 40, 1 << 56];
const NO_RANK: u8 = u8::MAX;

/// The work a victim loses, in GPUs (vCPUs for CPU work), capped so it never outweighs a rank.
fn loss(r: &RunningAttempt) -> u64 {
    let (g, c) = r.replicas.iter().fold((0u64, 0u64), |(g, c), x| (g + x.need.gpus, c + x.need.vcpus));
    (if g > 0 { g << 12 } else { c }).min((1 << 24) - 1)
}

fn cost(rank: u8, r: &RunningAttempt) -> u64 {
    if rank == 0 { 0 } else { WEIGHT[rank as usize] + loss(r) }
}

fn rank(a: &PendingAttempt, r: &RunningAttempt) -> u8 {
    if r.pool != a.pool {
        return NO_RANK;
    }
    if r.stopping {
        return 0;
    }
    if r.preemptible() {
        return if r.resource_type == ResourceType::Spot { 1 } else { 2 };
    }
    let same_group_lower = a.resource_type == ResourceType::Reserved
        && r.resource_type == ResourceType::Reserved
        && r.group == a.group
        && r.priority < a.priority;
    if same_group_lower { 3 } else { NO_RANK }
}

/// What the cycle knows about preemption: who is already doomed, where running work is, and a cheap upper
/// bound that rules out hopeless searches before they cost anything.
#[derive(Debug)]
pub(crate) struct Cx {
    /// Chosen as a victim this cycle: not available to another preemptor.
    pub doomed: Vec<bool>,
    by_pool: Vec<Vec<usize>>,
    /// Lowest priority of non-preemptible Reserved work per (group, pool): whether same-group preemption is
    /// possible at all.
    lowest_reserved: std::collections::BTreeMap<(GroupIx, PoolIx), u32>,
    /// Per node group: how many nodes have each amount of free-or-reclaimable room (scarce dimension), as
    /// at the start of the cycle. Room only shrinks during a cycle, so this stays an upper bound.
    bound: Option<Vec<Vec<u64>>>,
    searches: usize,
    /// (node group, replica need, replicas) that found no victims; larger gangs will not either.
    failures: Vec<(usize, Resources, u32)>,
    rank: Vec<u8>,
    is_evicted: Vec<bool>,
}

impl Cx {
    pub fn new(snap: &Snapshot) -> Self {
        let mut by_pool = vec![Vec::new(); snap.pools.len()];
        let mut lowest_reserved = std::collections::BTreeMap::new();
        for (i, r) in snap.running.iter().enumerate() {
            by_pool[r.pool.ix()].push(i);
            if r.resource_type == ResourceType::Reserved && !r.stopping && !r.preemptible() {
                let e = lowest_reserved.entry((r.group, r.pool)).or_insert(u32::MAX);
                *e = (*e).min(r.priority);
            }
        }
        Cx {
            doomed: vec![false; snap.running.len()],
            by_pool,
            lowest_reserved,
            bound: None,
            searches: 0,
            failures: Vec::new(),
            rank: vec![NO_RANK; snap.running.len()],
            is_evicted: vec![false; snap.running.len()],
        }
    }

    fn same_group_possible(&self, a: &PendingAttempt) -> bool {
        a.resource_type == ResourceType::Reserved
            && self.lowest_reserved.get(&(a.group, a.pool)).is_some_and(|&p| p < a.priority)
    }

    fn build_bound(&mut self, st: &State) -> &Vec<Vec<u64>> {
        self.bound.get_or_insert_with(|| {
            let snap = st.snap;
            let mut room = st.free.clone();
            for r in snap.running.iter().filter(|r| r.stopping || r.preemptible()) {
                for x in &r.replicas {
                    room[x.node.ix()] = room[x.node.ix()] + x.need;
                }
            }
            st.groups
                .iter()
                .map(|g| {
                    let mut hist = vec![0u64; g.buckets.len()];
                    for &n in g.buckets.iter().flatten() {
                        let primary = if g.model.is_some() { room[n.ix()].gpus } else { room[n.ix()].vcpus };
                        let top = hist.len() - 1;
                        hist[(primary as usize).min(top)] += 1;
                    }
                    hist
                })
                .collect()
        })
    }

    /// Whether a search could possibly succeed, cheaply. Counts the search when it says yes.
    pub fn worth_searching(&mut self, st: &State, a: &PendingAttempt, option: &GangOption) -> bool {
        if self.searches >= MAX_PREEMPTION_SEARCHES_PER_CYCLE {
            return false;
        }
        if !self.same_group_possible(a) {
            for role in &option.roles {
                let need = st.snap.replica_need(role);
                let model = st.snap.specs[role.spec.ix()].model;
                let Some(gi) = st.group_index(a.pool, model) else { return false };
                if self.failures.iter().any(|&(g, n, r)| g == gi && n.fits_in(&need) && role.replicas >= r) {
                    return false;
                }
                let primary = if model.is_some() { need.gpus } else { need.vcpus };
                if primary > 0 {
                    let hist = &self.build_bound(st)[gi];
                    let fit: u64 = hist
                        .iter()
                        .enumerate()
                        .skip(primary as usize)
                        .map(|(b, k)| k * (b as u64 / primary))
                        .sum();
                    if fit < u64::from(role.replicas) {
                        return false;
                    }
                }
            }
        }
        self.searches += 1;
        true
    }

    fn remember_failure(&mut self, st: &State, a: &PendingAttempt, option: &GangOption) {
        if self.same_group_possible(a) || option.roles.len() != 1 || self.failures.len() >= FAILURE_MEMO_MAX {
            return;
        }
        let role = &option.roles[0];
        if let Some(gi) = st.group_index(a.pool, st.snap.specs[role.spec.ix()].model) {
            self.failures.push((gi, st.snap.replica_need(role), role.replicas));
        }
    }
}

/// Evicts and restores running attempts on the cycle's state, remembering what it did.
struct Evictions<'a, 'c> {
    snap: &'a Snapshot,
    evicted: Vec<usize>,
    is_evicted: &'c mut Vec<bool>,
}

impl Evictions<'_, '_> {
    fn evict(&mut self, st: &mut State, v: usize) {
        let r = &self.snap.running[v];
        for rep in &r.replicas {
            st.release(rep.node, rep.need);
        }
        st.remove_usage(r.group, r.pool, &r.units);
        self.is_evicted[v] = true;
        self.evicted.push(v);
    }

    fn restore(&mut self, st: &mut State, v: usize) {
        let r = &self.snap.running[v];
        for rep in &r.replicas {
            st.alloc(rep.node, rep.need);
        }
        st.add_usage(r.group, r.pool, &r.units);
        self.is_evicted[v] = false;
    }

    fn restore_all(&mut self, st: &mut State) {
        while let Some(v) = self.evicted.pop() {
            if self.is_evicted[v] {
                self.restore(st, v);
            }
        }
    }
}

pub(crate) fn choose_victims(
    st: &mut State,
    cx: &mut Cx,
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
    short: Option<&crate::plan::QuotaShort>,
) -> Option<VictimChoice> {
    let snap = st.snap;
    // Rank the pool's running work for this preemptor (scratch, reset before returning).
    let pool_running = std::mem::take(&mut cx.by_pool[a.pool.ix()]);
    let mut cands: Vec<usize> = Vec::new();
    for &v in &pool_running {
        let k = if cx.doomed[v] { NO_RANK } else { rank(a, &snap.running[v]) };
        cx.rank[v] = k;
        if k != NO_RANK {
            cands.push(v);
        }
    }
    let mut is_evicted = std::mem::take(&mut cx.is_evicted);
    let mut ev = Evictions { snap, evicted: Vec::new(), is_evicted: &mut is_evicted };
    let result = search(st, &mut ev, &cx.rank, &cands, a, me, option, short);
    ev.restore_all(st);
    for &v in &pool_running {
        cx.rank[v] = NO_RANK;
    }
    cx.by_pool[a.pool.ix()] = pool_running;
    cx.is_evicted = is_evicted;
    if result.is_none() {
        cx.remember_failure(st, a, option);
    }
    result
}

/// The search itself, on the real state; the caller undoes every eviction.
#[allow(clippy::too_many_arguments)]
fn search(
    st: &mut State,
    ev: &mut Evictions,
    ranks: &[u8],
    cands: &[usize],
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
    short: Option<&crate::plan::QuotaShort>,
) -> Option<VictimChoice> {
    let snap = st.snap;
    // Attempts already stopping are free to count on.
    for &v in cands {
        if ranks[v] == 0 {
            ev.evict(st, v);
        }
    }

    // Quota: the group's own lower-priority work, lowest priority and newest first.
    if short.is_some() {
        for (s, u) in option_units(option) {
            let limit = snap.quotas.limit(a.group, ResourceType::Reserved, a.pool, s).unwrap_or(0);
            let used = st.group_used(a.group, UsageClass::Reserved, a.pool, s);
            let mut missing = (used + u).saturating_sub(limit);
            if missing == 0 {
                continue;
            }
            let mut same_group: Vec<usize> = cands
                .iter()
                .copied()
                .filter(|&v| ranks[v] == 3 && !ev.is_evicted[v])
                .filter(|&v| {
                    snap.running[v].units.iter().any(|x| x.spec == s && x.class == UsageClass::Reserved)
                })
                .collect();
            same_group.sort_by_key(|&v| {
                let r = &snap.running[v];
                (r.priority, std::cmp::Reverse(r.started_at_ms), r.id)
            });
            for v in same_group {
                if missing == 0 {
                    break;
                }
                let freed: u64 = snap.running[v]
                    .units
                    .iter()
                    .filter(|x| x.spec == s && x.class == UsageClass::Reserved)
                    .map(|x| x.units)
                    .sum();
                ev.evict(st, v);
                missing = missing.saturating_sub(freed);
            }
            if missing > 0 {
                return None;
            }
        }
        check_quota(st, a, option).ok()?;
    }

    // Nodes.
    let mut placed = match st.place_gang(a, me, option, false) {
        Ok(p) => p,
        Err(_) => place_with_evictions(st, ev, ranks, cands, a, me, option)?,
    };

    // Reprieve: put back every victim the gang can do without, most expensive first.
    let mut order: Vec<usize> = ev.evicted.iter().copied().filter(|&v| ev.is_evicted[v]).collect();
    order.sort_by_key(|&v| {
        std::cmp::Reverse((cost(ranks[v], &snap.running[v]), snap.running[v].started_at_ms))
    });
    for v in order {
        st.rollback(&placed);
        ev.restore(st, v);
        let quota_ok = short.is_none() || check_quota(st, a, option).is_ok();
        match quota_ok.then(|| st.place_gang(a, me, option, false).ok()).flatten() {
            Some(p) => placed = p,
            None => {
                // Not without it: take it again and put the gang back exactly where it was.
                ev.evict(st, v);
                for &(_, _, n, need) in &placed {
                    st.alloc(n, need);
                }
            }
        }
    }

    let mut victims: Vec<usize> = ev.evicted.iter().copied().filter(|&v| ev.is_evicted[v]).collect();
    victims.sort_unstable();
    victims.dedup();
    let mut nodes: Vec<NodeIx> = placed.iter().map(|&(_, _, n, _)| n).collect();
    nodes.sort_unstable();
    nodes.dedup();
    st.rollback(&placed);
    Some(VictimChoice { victims, nodes })
}

/// Places the gang replica by replica, evicting on each node the cheapest victims that make room. On failure
/// the gang's own allocations are undone (the evictions are undone by the caller).
fn place_with_evictions(
    st: &mut State,
    ev: &mut Evictions,
    ranks: &[u8],
    cands: &[usize],
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
) -> Option<Placed> {
    let mut placed: Placed = Vec::new();
    let ok = evict_and_place(st, ev, ranks, cands, a, me, option, &mut placed);
    if ok.is_none() {
        st.rollback(&placed);
        return None;
    }
    Some(placed)
}

#[allow(clippy::too_many_arguments)]
fn evict_and_place(
    st: &mut State,
    ev: &mut Evictions,
    ranks: &[u8],
    cands: &[usize],
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
    placed: &mut Placed,
) -> Option<()> {
    let snap = st.snap;
    // Candidate victims per node, cheapest first.
    let mut on_node: std::collections::BTreeMap<NodeIx, Vec<(u64, usize)>> =
        std::collections::BTreeMap::new();
    for &v in cands {
        let k = ranks[v];
        if k == 0 || ev.is_evicted[v] {
            continue;
        }
        let r = &snap.running[v];
        for rep in &r.replicas {
            let list = on_node.entry(rep.node).or_default();
            if !list.iter().any(|&(_, x)| x == v) {
                list.push((cost(k, r), v));
            }
        }
    }
    for list in on_node.values_mut() {
        list.sort_by_key(|&(w, v)| (w, std::cmp::Reverse(snap.running[v].started_at_ms), v));
    }
    const NONE: &[(u64, usize)] = &[];
    let victims_on = |n: NodeIx| on_node.get(&n).map_or(NONE, Vec::as_slice);

    let mut roles: Vec<(usize, &Role)> = option.roles.iter().enumerate().collect();
    roles.sort_by_key(|(i, r)| {
        let n = snap.replica_need(r);
        (std::cmp::Reverse((n.gpus, n.vcpus, n.memory_mib)), *i)
    });
    for (ri, role) in roles {
        let need = snap.replica_need(role);
        let model = snap.specs[role.spec.ix()].model;
        let gi = st.group_index(a.pool, model)?;
        // Nodes of the group by the cost of making room there now; costs only fall as victims go.
        let mut by_cost: Vec<(u64, NodeIx)> = st.groups[gi]
            .buckets
            .iter()
            .flatten()
            .filter(|&&n| usable(st, n, me, a))
            .filter_map(|&n| room_cost(st, ev, victims_on(n), n, need).map(|(c, _)| (c, n)))
            .collect();
        by_cost.sort_unstable();
        let mut cursor = 0;
        for k in 0..role.replicas {
            let node = match st.find(gi, need, me, &a.excluded, false) {
                Some(n) => n,
                None => loop {
                    let &(_, n) = by_cost.get(cursor)?;
                    match room_cost(st, ev, victims_on(n), n, need) {
                        Some((_, victims)) => {
                            for v in victims {
                                ev.evict(st, v);
                            }
                            break n;
                        }
                        None => cursor += 1,
                    }
                },
            };
            st.alloc(node, need);
            placed.push((ri, k, node, need));
        }
    }
    Some(())
}

fn usable(st: &State, n: NodeIx, me: usize, a: &PendingAttempt) -> bool {
    let h = st.holder[n.ix()];
    (h == 0 || h as usize == me + 1) && !a.excluded.contains(&n)
}

/// The cheapest prefix of the node's victims that makes room for `need`: (cost, victims). `None` if even all
/// of them are not enough.
fn room_cost(
    st: &State,
    ev: &Evictions,
    victims: &[(u64, usize)],
    n: NodeIx,
    need: trainyard_core::demand::Resources,
) -> Option<(u64, Vec<usize>)> {
    let mut free = st.free[n.ix()];
    let mut cost = 0;
    let mut chosen = Vec::new();
    for &(w, v) in victims {
        if need.fits_in(&free) {
            break;
        }
        if ev.is_evicted[v] {
            continue;
        }
        for rep in st.snap.running[v].replicas.iter().filter(|r| r.node == n) {
            free = free + rep.need;
        }
        cost += w;
        chosen.push(v);
    }
    need.fits_in(&free).then_some((cost, chosen))
}
