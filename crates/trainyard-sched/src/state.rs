//! The working state of one scheduling cycle: free capacity per node with an index for fast fitting, and the
//! quota counters. Built from a [`Snapshot`], changed by tentative and final allocations, and thrown away at
//! the end of the cycle.

use crate::snapshot::*;
use trainyard_core::demand::Resources;
use trainyard_core::spec::ResourceType;

pub(crate) fn sub(a: Resources, b: Resources) -> Resources {
    debug_assert!(b.fits_in(&a), "releasing more than allocated: {a:?} - {b:?}");
    Resources {
        gpus: a.gpus.saturating_sub(b.gpus),
        vcpus: a.vcpus.saturating_sub(b.vcpus),
        memory_mib: a.memory_mib.saturating_sub(b.memory_mib),
    }
}

/// How many units of `per_unit` fit in `have`.
pub(crate) fn units_in(have: Resources, per_unit: Resources) -> u64 {
    let d = |h: u64, n: u64| h.checked_div(n).unwrap_or(u64::MAX);
    d(have.gpus, per_unit.gpus)
        .min(d(have.vcpus, per_unit.vcpus))
        .min(d(have.memory_mib, per_unit.memory_mib))
}

/// Nodes of one (pool, GPU model) bucketed by the free amount of their scarcest dimension: GPUs on GPU
/// nodes, vCPUs on CPU nodes. Finding a node for a replica is then a walk up from the bucket of its need,
/// best fit first, which keeps large free blocks for large replicas.
#[derive(Debug, Clone)]
pub(crate) struct NodeGroup {
    pub model: Option<ModelIx>,
    pub buckets: Vec<Vec<NodeIx>>,
}

impl NodeGroup {
    fn primary(&self, r: &Resources) -> u64 {
        if self.model.is_some() { r.gpus } else { r.vcpus }
    }
}

/// Why a gang did not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct NoFit {
    pub role: usize,
    pub need: Resources,
    /// Replicas of that role already placed when it failed.
    pub placed: u32,
}

/// A tentative placement: (role, replica index, node, need).
pub(crate) type Placed = Vec<(usize, u32, NodeIx, Resources)>;

/// Upper bounds on the size of the search, so a cycle's cost stays bounded whatever the input.
const FAILURE_CACHE_MAX: usize = 32;

#[derive(Debug)]
pub(crate) struct State<'s> {
    pub snap: &'s Snapshot,
    pub free: Vec<Resources>,
    /// Pending index + 1 of the attempt holding the node this cycle (a starving gang's reservation or a
    /// preemptor's nomination); 0 when nobody holds it.
    pub holder: Vec<u32>,
    /// Every pending index + 1 that holds at least one node.
    pub holders: Vec<u32>,
    /// (holder tag, node) for every hold, so holds can be given back.
    held: Vec<(u32, NodeIx)>,
    pub groups: Vec<NodeGroup>,
    /// Node -> (group, bucket, position in bucket); group u32::MAX for nodes that take no work.
    pos: Vec<(u32, u32, u32)>,
    /// (pool, model+1) -> group index.
    group_of: Vec<Option<u32>>,
    n_models: usize,
    /// Units in use per [class][pool][spec].
    class_used: Vec<u64>,
    /// Units in use per [group][class][pool][spec].
    group_used: Vec<u64>,
    /// Sum of Reserved quotas per [pool][spec].
    reserved_total: Vec<u64>,
    /// Units of each spec the pool's schedulable nodes hold when empty, per [pool][spec]; computed on demand.
    capacity_units: Vec<Option<u64>>,
    /// Gangs that failed on free capacity this cycle, per group: (replica need, replicas). Free capacity only
    /// shrinks during a pass, so a larger gang of larger replicas fails too.
    failures: Vec<Vec<(Resources, u32)>>,
    pub n_pools: usize,
    pub n_specs: usize,
}

pub(crate) fn class_ix(c: UsageClass) -> usize {
    match c {
        UsageClass::Reserved => 0,
        UsageClass::Borrowed => 1,
        UsageClass::Ondemand => 2,
        UsageClass::Spot => 3,
        UsageClass::Idle => 4,
    }
}

impl<'s> State<'s> {
    pub fn new(snap: &'s Snapshot) -> Self {
        let n_models = snap.models.len();
        let n_pools = snap.pools.len();
        let n_specs = snap.specs.len();
        let mut group_of = vec![None; n_pools * (n_models + 1)];
        let mut groups: Vec<NodeGroup> = Vec::new();
        let mut pos = vec![(u32::MAX, 0, 0); snap.nodes.len()];
        let mut max_primary: Vec<u64> = Vec::new();
        let key = |p: PoolIx, m: Option<ModelIx>| p.ix() * (n_models + 1) + m.map_or(0, |m| m.ix() + 1);
        for n in snap.nodes.iter().filter(|n| n.schedulable) {
            let k = key(n.pool, n.model);
            let gi = *group_of[k].get_or_insert_with(|| {
                groups.push(NodeGroup { model: n.model, buckets: Vec::new() });
                max_primary.push(0);
                (groups.len() - 1) as u32
            }) as usize;
            let cap = groups[gi].primary(&n.capacity);
            max_primary[gi] = max_primary[gi].max(cap);
        }
        for (g, m) in groups.iter_mut().zip(&max_primary) {
            g.buckets = vec![Vec::new(); *m as usize + 1];
        }
        let free: Vec<Resources> = snap.nodes.iter().map(|n| sub_sat(n.capacity, n.used)).collect();
        for (i, n) in snap.nodes.iter().enumerate() {
            if !n.schedulable {
                continue;
            }
            let gi =
                group_of[key(n.pool, n.model)].expect("every schedulable node's group was created above");
            let g = &mut groups[gi as usize];
            let b = (g.primary(&free[i]) as usize).min(g.buckets.len() - 1);
            pos[i] = (gi, b as u32, g.buckets[b].len() as u32);
            g.buckets[b].push(NodeIx(i as u32));
        }

        let mut reserved_total = vec![0u64; n_pools * n_specs];
        for g in 0..snap.groups.len() {
            for p in 0..n_pools {
                for s in 0..n_specs {
                    let units = snap
                        .quotas
                        .limit(GroupIx(g as u16), ResourceType::Reserved, PoolIx(p as u16), SpecIx(s as u16))
                        .unwrap_or(0);
                    reserved_total[p * n_specs + s] += units;
                }
            }
        }
        let mut st = State {
            snap,
            free,
            holder: vec![0; snap.nodes.len()],
            holders: Vec::new(),
            held: Vec::new(),
            failures: vec![Vec::new(); groups.len()],
            groups,
            pos,
            group_of,
            n_models,
            class_used: vec![0; 5 * n_pools * n_specs],
            group_used: vec![0; snap.groups.len() * 5 * n_pools * n_specs],
            reserved_total,
            capacity_units: vec![None; n_pools * n_specs],
            n_pools,
            n_specs,
        };
        for a in &snap.running {
            st.add_usage(a.group, a.pool, &a.units);
        }
        st
    }

    pub fn group_index(&self, pool: PoolIx, model: Option<ModelIx>) -> Option<usize> {
        self.group_of[pool.ix() * (self.n_models + 1) + model.map_or(0, |m| m.ix() + 1)].map(|g| g as usize)
    }

    fn reindex(&mut self, node: NodeIx) {
        let (gi, b, i) = self.pos[node.ix()];
        if gi == u32::MAX {
            return;
        }
        let g = &mut self.groups[gi as usize];
        let nb = (g.primary(&self.free[node.ix()]) as usize).min(g.buckets.len() - 1) as u32;
        if nb == b {
            return;
        }
        let bucket = &mut g.buckets[b as usize];
        bucket.swap_remove(i as usize);
        if let Some(moved) = bucket.get(i as usize) {
            self.pos[moved.ix()].2 = i;
        }
        let nbucket = &mut g.buckets[nb as usize];
        self.pos[node.ix()] = (gi, nb, nbucket.len() as u32);
        nbucket.push(node);
    }

    pub fn alloc(&mut self, node: NodeIx, need: Resources) {
        self.free[node.ix()] = sub(self.free[node.ix()], need);
        self.reindex(node);
    }

    pub fn release(&mut self, node: NodeIx, need: Resources) {
        self.free[node.ix()] = self.free[node.ix()] + need;
        self.reindex(node);
    }

    /// Whether attempt `me` (pending index) may use `node`.
    fn usable(&self, node: NodeIx, me: usize, excluded: &[NodeIx], ignore_holds: bool) -> bool {
        let h = self.holder[node.ix()];
        (ignore_holds || h == 0 || h as usize == me + 1) && !excluded.contains(&node)
    }

    /// The best-fitting usable node for one replica, if any.
    pub fn find(
        &self,
        gi: usize,
        need: Resources,
        me: usize,
        excluded: &[NodeIx],
        ignore_holds: bool,
    ) -> Option<NodeIx> {
        let g = &self.groups[gi];
        let p = g.primary(&need) as usize;
        for bucket in g.buckets.iter().skip(p) {
            for &n in bucket {
                if need.fits_in(&self.free[n.ix()]) && self.usable(n, me, excluded, ignore_holds) {
                    return Some(n);
                }
            }
        }
        None
    }

    /// An upper bound on how many replicas of `need` the group's free capacity holds (scarcest dimension
    /// only). Cheap: one pass over the buckets.
    pub fn fit_bound(&self, gi: usize, need: Resources) -> u64 {
        let g = &self.groups[gi];
        let p = g.primary(&need);
        if p == 0 {
            return u64::MAX;
        }
        g.buckets
            .iter()
            .enumerate()
            .skip(p as usize)
            .map(|(b, nodes)| nodes.len() as u64 * (b as u64 / p))
            .sum()
    }

    /// Places every replica of `option` or none: on success the allocations stay and are returned; on
    /// failure everything is rolled back.
    pub fn place_gang(
        &mut self,
        a: &PendingAttempt,
        me: usize,
        option: &GangOption,
        ignore_holds: bool,
    ) -> Result<Placed, NoFit> {
        // Largest replicas first: they are the hardest to fit.
        let mut roles: Vec<(usize, Resources, &Role)> =
            option.roles.iter().enumerate().map(|(i, r)| (i, self.snap.replica_need(r), r)).collect();
        roles.sort_by(|x, y| {
            (y.1.gpus, y.1.vcpus, y.1.memory_mib, x.0).cmp(&(x.1.gpus, x.1.vcpus, x.1.memory_mib, y.0))
        });
        let cacheable = a.excluded.is_empty() && !ignore_holds && !self.holds_any(me);
        for &(ri, need, role) in &roles {
            let model = self.snap.specs[role.spec.ix()].model;
            let Some(gi) = self.group_index(a.pool, model) else {
                return Err(NoFit { role: ri, need, placed: 0 });
            };
            if self.fit_bound(gi, need) < u64::from(role.replicas)
                || (cacheable && self.known_failure(gi, need, role.replicas))
            {
                return Err(NoFit { role: ri, need, placed: 0 });
            }
        }
        let mut placed: Placed = Vec::with_capacity(option.roles.iter().map(|r| r.replicas as usize).sum());
        for &(ri, need, role) in &roles {
            let model = self.snap.specs[role.spec.ix()].model;
            let gi = self.group_index(a.pool, model).expect("checked above");
            for k in 0..role.replicas {
                match self.find(gi, need, me, &a.excluded, ignore_holds) {
                    Some(n) => {
                        self.alloc(n, need);
                        placed.push((ri, k, n, need));
                    }
                    None => {
                        self.rollback(&placed);
                        if cacheable {
                            self.remember_failure(gi, need, role.replicas);
                        }
                        return Err(NoFit { role: ri, need, placed: k });
                    }
                }
            }
        }
        Ok(placed)
    }

    pub fn rollback(&mut self, placed: &Placed) {
        for &(_, _, n, need) in placed {
            self.release(n, need);
        }
    }

    fn holds_any(&self, me: usize) -> bool {
        self.holders.contains(&(me as u32 + 1))
    }

    /// Holds `nodes` for attempt `me` for the rest of the cycle: nobody else is placed there.
    pub fn hold(&mut self, me: usize, nodes: impl IntoIterator<Item = NodeIx>) {
        let tag = me as u32 + 1;
        for n in nodes {
            // A nomination from an older snapshot may name a node that is gone.
            if self.holder.get(n.ix()) == Some(&0) {
                self.holder[n.ix()] = tag;
                self.held.push((tag, n));
            }
        }
        if !self.holders.contains(&tag) {
            self.holders.push(tag);
        }
    }

    /// Gives back what `me` held (it was admitted, so the hold has served).
    pub fn unhold(&mut self, me: usize) {
        let tag = me as u32 + 1;
        if !self.holders.contains(&tag) {
            return;
        }
        for &(t, n) in &self.held {
            if t == tag {
                self.holder[n.ix()] = 0;
            }
        }
        self.held.retain(|&(t, _)| t != tag);
        self.holders.retain(|&t| t != tag);
    }

    fn known_failure(&self, gi: usize, need: Resources, replicas: u32) -> bool {
        self.failures[gi].iter().any(|(n, r)| n.fits_in(&need) && replicas >= *r)
    }

    fn remember_failure(&mut self, gi: usize, need: Resources, replicas: u32) {
        let f = &mut self.failures[gi];
        if f.len() < FAILURE_CACHE_MAX {
            f.push((need, replicas));
        }
    }

    // ---- quota counters ----

    fn ps(&self, p: PoolIx, s: SpecIx) -> usize {
        p.ix() * self.n_specs + s.ix()
    }

    fn cu(&self, c: UsageClass, p: PoolIx, s: SpecIx) -> usize {
        class_ix(c) * self.n_pools * self.n_specs + self.ps(p, s)
    }

    fn gu(&self, g: GroupIx, c: UsageClass, p: PoolIx, s: SpecIx) -> usize {
        (g.ix() * 5 + class_ix(c)) * self.n_pools * self.n_specs + self.ps(p, s)
    }

    pub fn add_usage(&mut self, g: GroupIx, p: PoolIx, units: &[UnitUse]) {
        for u in units {
            let (c, gi) = (self.cu(u.class, p, u.spec), self.gu(g, u.class, p, u.spec));
            self.class_used[c] += u.units;
            self.group_used[gi] += u.units;
        }
    }

    pub fn remove_usage(&mut self, g: GroupIx, p: PoolIx, units: &[UnitUse]) {
        for u in units {
            let (c, gi) = (self.cu(u.class, p, u.spec), self.gu(g, u.class, p, u.spec));
            self.class_used[c] -= u.units;
            self.group_used[gi] -= u.units;
        }
    }

    pub fn class_used(&self, c: UsageClass, p: PoolIx, s: SpecIx) -> u64 {
        self.class_used[self.cu(c, p, s)]
    }

    pub fn group_used(&self, g: GroupIx, c: UsageClass, p: PoolIx, s: SpecIx) -> u64 {
        self.group_used[self.gu(g, c, p, s)]
    }

    pub fn reserved_total(&self, p: PoolIx, s: SpecIx) -> u64 {
        self.reserved_total[self.ps(p, s)]
    }

    /// Reserved capacity nobody uses now: what Idle tasks and idle supplementation may borrow.
    pub fn idle_available(&self, p: PoolIx, s: SpecIx) -> u64 {
        self.reserved_total(p, s).saturating_sub(
            self.class_used(UsageClass::Reserved, p, s)
                + self.class_used(UsageClass::Idle, p, s)
                + self.class_used(UsageClass::Borrowed, p, s),
        )
    }

    /// Units of spec `s` the pool's schedulable nodes hold when empty.
    pub fn capacity_units(&mut self, p: PoolIx, s: SpecIx) -> u64 {
        let i = self.ps(p, s);
        if let Some(v) = self.capacity_units[i] {
            return v;
        }
        let spec = &self.snap.specs[s.ix()];
        let v = self
            .snap
            .nodes
            .iter()
            .filter(|n| n.schedulable && n.pool == p && n.model == spec.model)
            .map(|n| units_in(n.capacity, spec.per_unit))
            .sum();
        self.capacity_units[i] = Some(v);
        v
    }

    /// Capacity no group reserved: where Ondemand tasks run.
    pub fn unreserved_units(&mut self, p: PoolIx, s: SpecIx) -> u64 {
        self.capacity_units(p, s).saturating_sub(self.reserved_total(p, s))
    }
}

fn sub_sat(a: Resources, b: Resources) -> Resources {
    Resources {
        gpus: a.gpus.saturating_sub(b.gpus),
        vcpus: a.vcpus.saturating_sub(b.vcpus),
        memory_mib: a.memory_mib.saturating_sub(b.memory_mib),
    }
}
