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
use trainyard_core::spec::ResourceType;

/// The victims (indexes into `Snapshot::running`) and the nodes the gang will use.
#[derive(Debug)]
pub(crate) struct VictimChoice {
    pub victims: Vec<usize>,
    pub nodes: Vec<NodeIx>,
}

/// Cost of preempting one attempt of each rank. Each rank outweighs any number of victims of the ranks
/// below it that one gang could need; within a rank, [`loss`] breaks ties towards the smaller loss.
const WEIGHT: [u64; 4] = [0, 1 << 24, 1 << 40, 1 << 56];

/// The work a victim loses, in GPUs (vCPUs for CPU work), capped so it never outweighs a rank.
fn loss(r: &RunningAttempt) -> u64 {
    let (g, c) = r.replicas.iter().fold((0u64, 0u64), |(g, c), x| (g + x.need.gpus, c + x.need.vcpus));
    (if g > 0 { g << 12 } else { c }).min((1 << 24) - 1)
}

fn cost(rank: usize, r: &RunningAttempt) -> u64 {
    if rank == 0 { 0 } else { WEIGHT[rank] + loss(r) }
}

fn rank(a: &PendingAttempt, r: &RunningAttempt) -> Option<usize> {
    if r.pool != a.pool {
        return None;
    }
    if r.stopping {
        return Some(0);
    }
    if r.preemptible() {
        return Some(if r.resource_type == ResourceType::Spot { 1 } else { 2 });
    }
    let same_group_lower = a.resource_type == ResourceType::Reserved
        && r.resource_type == ResourceType::Reserved
        && r.group == a.group
        && r.priority < a.priority;
    same_group_lower.then_some(3)
}

/// Evicts and restores running attempts on the cycle's state, remembering what it did.
struct Evictions<'a> {
    snap: &'a Snapshot,
    evicted: Vec<usize>,
    is_evicted: Vec<bool>,
}

impl Evictions<'_> {
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
    doomed: &[bool],
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
    short: Option<&crate::plan::QuotaShort>,
) -> Option<VictimChoice> {
    let snap = st.snap;
    let ranks: Vec<Option<usize>> =
        snap.running.iter().enumerate().map(|(i, r)| if doomed[i] { None } else { rank(a, r) }).collect();
    let mut ev = Evictions { snap, evicted: Vec::new(), is_evicted: vec![false; snap.running.len()] };

    // Attempts already stopping are free to count on.
    for (v, r) in ranks.iter().enumerate() {
        if *r == Some(0) {
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
            let mut cands: Vec<usize> = (0..snap.running.len())
                .filter(|&v| ranks[v] == Some(3) && !ev.is_evicted[v])
                .filter(|&v| {
                    snap.running[v].units.iter().any(|x| x.spec == s && x.class == UsageClass::Reserved)
                })
                .collect();
            cands.sort_by_key(|&v| {
                let r = &snap.running[v];
                (r.priority, std::cmp::Reverse(r.started_at_ms), r.id)
            });
            for v in cands {
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
                ev.restore_all(st);
                return None;
            }
        }
        if check_quota(st, a, option).is_err() {
            ev.restore_all(st);
            return None;
        }
    }

    // Nodes.
    let placed = match st.place_gang(a, me, option, false) {
        Ok(p) => p,
        Err(_) => match place_with_evictions(st, &mut ev, &ranks, a, me, option) {
            Some(p) => p,
            None => {
                ev.restore_all(st);
                return None;
            }
        },
    };

    // Reprieve: put back every victim the gang can do without, most expensive first.
    let mut placed = placed;
    let order: Vec<usize> = {
        let mut o: Vec<usize> = ev.evicted.iter().copied().filter(|&v| ev.is_evicted[v]).collect();
        o.sort_by_key(|&v| {
            std::cmp::Reverse((
                ranks[v].map_or(0, |k| cost(k, &snap.running[v])),
                snap.running[v].started_at_ms,
            ))
        });
        o
    };
    let needs_quota_check = short.is_some();
    for v in order {
        st.rollback(&placed);
        ev.restore(st, v);
        let quota_ok = !needs_quota_check || check_quota(st, a, option).is_ok();
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

    let victims: Vec<usize> = {
        let mut v: Vec<usize> = ev.evicted.iter().copied().filter(|&v| ev.is_evicted[v]).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let mut nodes: Vec<NodeIx> = placed.iter().map(|&(_, _, n, _)| n).collect();
    nodes.sort_unstable();
    nodes.dedup();
    st.rollback(&placed);
    ev.restore_all(st);
    Some(VictimChoice { victims, nodes })
}

/// Places the gang replica by replica, evicting on each node the cheapest victims that make room. On failure
/// the gang's own allocations are undone (the evictions are undone by the caller).
fn place_with_evictions(
    st: &mut State,
    ev: &mut Evictions,
    ranks: &[Option<usize>],
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
) -> Option<Placed> {
    let mut placed: Placed = Vec::new();
    let ok = evict_and_place(st, ev, ranks, a, me, option, &mut placed);
    if ok.is_none() {
        st.rollback(&placed);
        return None;
    }
    Some(placed)
}

fn evict_and_place(
    st: &mut State,
    ev: &mut Evictions,
    ranks: &[Option<usize>],
    a: &PendingAttempt,
    me: usize,
    option: &GangOption,
    placed: &mut Placed,
) -> Option<()> {
    let snap = st.snap;
    // Candidate victims per node, cheapest first.
    let mut on_node: Vec<Vec<(u64, usize)>> = vec![Vec::new(); snap.nodes.len()];
    for (v, r) in snap.running.iter().enumerate() {
        let Some(k) = ranks[v] else { continue };
        if k == 0 || ev.is_evicted[v] {
            continue;
        }
        for rep in &r.replicas {
            let list = &mut on_node[rep.node.ix()];
            if !list.iter().any(|&(_, x)| x == v) {
                list.push((cost(k, r), v));
            }
        }
    }
    for list in &mut on_node {
        list.sort_by_key(|&(w, v)| (w, std::cmp::Reverse(snap.running[v].started_at_ms), v));
    }

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
            .filter_map(|&n| room_cost(st, ev, &on_node[n.ix()], n, need).map(|(c, _)| (c, n)))
            .collect();
        by_cost.sort_unstable();
        let mut cursor = 0;
        for k in 0..role.replicas {
            let node = match st.find(gi, need, me, &a.excluded, false) {
                Some(n) => n,
                None => loop {
                    let &(_, n) = by_cost.get(cursor)?;
                    match room_cost(st, ev, &on_node[n.ix()], n, need) {
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
