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

use crate::quota::{check_quota, option_units};
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
pub const MAX_PREEMPTION_SEARCHES_PER_CYCLE: usize = 16;
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
    /// Lowest priority of non-preemptible Reserved work per (group, pool), 0 when some of it is stopping:
    /// whether quota can come back to a Reserved attempt of the group at all.
    lowest_reserved: std::collections::BTreeMap<(GroupIx, PoolIx), u32>,
    /// Per node group: how many nodes have each amount of free-or-reclaimable room (scarce dimension), as
    /// at the start of the cycle. Room only shrinks during a cycle, so this stays an upper bound.
    bound: Option<Vec<Vec<u64>>>,
    /// Per node, what stopping and preemptible work there would give back (for everyone but the
    /// same-group rule), and which running attempts have replicas there; built on the first search.
    reclaim: Vec<Resources>,
    runs: NodeRuns,
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
            // Quota comes back from the group's lower-priority work, and from any of its work already
            // stopping (counted as priority 0: it is leaving whatever its priority).
            if r.resource_type == ResourceType::Reserved && (r.stopping || !r.preemptible()) {
                let e = lowest_reserved.entry((r.group, r.pool)).or_insert(u32::MAX);
                *e = (*e).min(if r.stopping { 0 } else { r.priority });
            }
        }
        Cx {
            doomed: vec![false; snap.running.len()],
            by_pool,
            lowest_reserved,
            bound: None,
            reclaim: Vec::new(),
            runs: NodeRuns::default(),
            searches: 0,
            failures: Vec::new(),
            rank: vec![NO_RANK; snap.running.len()],
            is_evicted: vec![false; snap.running.len()],
        }
    }

    /// Whether lower-priority (or stopping) Reserved work of the attempt's group runs in its pool: only then
    /// can a Reserved attempt short of quota get it back.
    pub fn same_group_possible(&self, a: &PendingAttempt) -> bool {
        a.resource_type == ResourceType::Reserved
            && self.lowest_reserved.get(&(a.group, a.pool)).is_some_and(|&p| p < a.priority)
    }

    /// Builds, once per cycle, the per-node reclaimable room, the node -> running index and the bound.
    fn prepare(&mut self, st: &State) {
        if self.bound.is_some() {
            return;
        }
        let snap = st.snap;
        self.runs = NodeRuns::new(snap);
        let mut reclaim = vec![Resources::default(); snap.nodes.len()];
        for r in snap.running.iter().filter(|r| r.stopping || r.preemptible()) {
            for x in &r.replicas {
                reclaim[x.node.ix()] = reclaim[x.node.ix()] + x.need;
            }
        }
        let bound = st
            .groups
            .iter()
            .map(|g| {
                let mut hist = vec![0u64; g.buckets.len()];
                let top = hist.len() - 1;
                for &n in g.buckets.iter().flatten() {
                    let room = st.free[n.ix()] + reclaim[n.ix()];
                    let primary = if g.model.is_some() { room.gpus } else { room.vcpus };
                    hist[(primary as usize).min(top)] += 1;
                }
                hist
            })
            .collect();
        self.reclaim = reclaim;
        self.bound = Some(bound);
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
                    self.prepare(st);
                    let hist = &self.bound.as_ref().expect("prepared above")[gi];
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

/// Which running attempts have replicas on each node (each attempt once per node), as offsets into one list.
#[derive(Debug, Default)]
struct NodeRuns {
    start: Vec<u32>,
    runs: Vec<u32>,
}

impl NodeRuns {
    fn new(snap: &Snapshot) -> Self {
        let n_nodes = snap.nodes.len();
        // Slots per node (duplicates included), then their offsets.
        let mut first = vec![0u32; n_nodes + 1];
        for r in &snap.running {
            for x in &r.replicas {
                first[x.node.ix() + 1] += 1;
            }
        }
        for i in 1..first.len() {
            first[i] += first[i - 1];
        }
        let mut end: Vec<u32> = first[..n_nodes].to_vec();
        let mut slots = vec![u32::MAX; first[n_nodes] as usize];
        for (i, r) in snap.running.iter().enumerate() {
            for x in &r.replicas {
                let n = x.node.ix();
                // An attempt's replicas on one node land next to each other: keep the attempt once.
                if end[n] > first[n] && slots[end[n] as usize - 1] == i as u32 {
                    continue;
                }
                slots[end[n] as usize] = i as u32;
                end[n] += 1;
            }
        }
        let mut start = Vec::with_capacity(n_nodes + 1);
        let mut runs = Vec::with_capacity(slots.len());
        for n in 0..n_nodes {
            start.push(runs.len() as u32);
            runs.extend_from_slice(&slots[first[n] as usize..end[n] as usize]);
        }
        start.push(runs.len() as u32);
        NodeRuns { start, runs }
    }

    fn on(&self, n: NodeIx) -> &[u32] {
        &self.runs[self.start[n.ix()] as usize..self.start[n.ix() + 1] as usize]
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
    cx.prepare(st);
    let mut is_evicted = std::mem::take(&mut cx.is_evicted);
    let mut ev = Evictions { snap, evicted: Vec::new(), is_evicted: &mut is_evicted };
    let near = Nearby {
        ranks: &cx.rank,
        runs: &cx.runs,
        reclaim: &cx.reclaim,
        same_group: cx.same_group_possible(a),
    };
    let result = search(st, &mut ev, &near, &cands, a, me, option, short);
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
    near: &Nearby,
    cands: &[usize],
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
    short: Option<&crate::plan::QuotaShort>,
) -> Option<VictimChoice> {
    let snap = st.snap;
    let ranks = near.ranks;
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
        Err(_) => place_with_evictions(st, ev, near, a, me, option)?,
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
    near: &Nearby,
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
) -> Option<Placed> {
    let mut placed: Placed = Vec::new();
    let ok = evict_and_place(st, ev, near, a, me, option, &mut placed);
    if ok.is_none() {
        st.rollback(&placed);
        return None;
    }
    Some(placed)
}

/// What a search knows about the neighbourhood of each node: the ranks of the running attempts for this
/// preemptor, which attempts run on each node, and what preemptible work there would give back.
struct Nearby<'c> {
    ranks: &'c [u8],
    runs: &'c NodeRuns,
    reclaim: &'c [Resources],
    /// Whether same-group lower-priority work may be preempted (then `reclaim` is not an upper bound).
    same_group: bool,
}

impl Nearby<'_> {
    /// The node's victims for this preemptor, cheapest first, into `buf`.
    fn victims(
        &self,
        st: &State,
        ev: &Evictions,
        n: NodeIx,
        buf: &mut Vec<(u64, std::cmp::Reverse<u64>, usize)>,
    ) {
        buf.clear();
        for &v in self.runs.on(n) {
            let v = v as usize;
            let k = self.ranks[v];
            if k == NO_RANK || k == 0 || ev.is_evicted[v] {
                continue;
            }
            let r = &st.snap.running[v];
            buf.push((cost(k, r), std::cmp::Reverse(r.started_at_ms), v));
        }
        buf.sort_unstable();
    }

    /// The cost of making room for `need` on `n` by evicting its cheapest victims; `None` if even all of
    /// them are not enough. With `take`, the victims chosen.
    fn room(
        &self,
        st: &State,
        ev: &Evictions,
        n: NodeIx,
        need: Resources,
        buf: &mut Vec<(u64, std::cmp::Reverse<u64>, usize)>,
        mut take: Option<&mut Vec<usize>>,
    ) -> Option<u64> {
        let mut free = st.free[n.ix()];
        if need.fits_in(&free) {
            return Some(0);
        }
        if !self.same_group && !need.fits_in(&(free + self.reclaim[n.ix()])) {
            return None;
        }
        self.victims(st, ev, n, buf);
        let mut cost = 0;
        for &(w, _, v) in buf.iter() {
            for rep in st.snap.running[v].replicas.iter().filter(|r| r.node == n) {
                free = free + rep.need;
            }
            cost += w;
            if let Some(t) = take.as_deref_mut() {
                t.push(v);
            }
            if need.fits_in(&free) {
                return Some(cost);
            }
        }
        None
    }
}

fn evict_and_place(
    st: &mut State,
    ev: &mut Evictions,
    near: &Nearby,
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
    placed: &mut Placed,
) -> Option<()> {
    let snap = st.snap;
    let mut buf = Vec::new();
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
        let nodes: Vec<NodeIx> =
            st.groups[gi].buckets.iter().flatten().copied().filter(|&n| usable(st, n, me, a)).collect();
        let mut by_cost: Vec<(u64, NodeIx)> = nodes
            .into_iter()
            .filter_map(|n| near.room(st, ev, n, need, &mut buf, None).map(|c| (c, n)))
            .collect();
        by_cost.sort_unstable();
        let mut cursor = 0;
        for k in 0..role.replicas {
            let node = match st.find(gi, need, me, &a.excluded, false) {
                Some(n) => n,
                None => loop {
                    let &(_, n) = by_cost.get(cursor)?;
                    let mut victims = Vec::new();
                    match near.room(st, ev, n, need, &mut buf, Some(&mut victims)) {
                        Some(_) => {
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
