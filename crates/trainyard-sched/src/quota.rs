//! The quota check of one gang option: what it needs per instance spec, and how its units count (Reserved,
//! Borrowed from idle capacity, Ondemand, Spot, Idle) or which limit it is short of. Shared by the cycle and
//! the victim search.

use crate::plan::*;
use crate::snapshot::*;
use crate::state::State;
use trainyard_core::spec::ResourceType;

/// What one option needs from quota, per spec.
pub(crate) fn option_units(option: &GangOption) -> Vec<(SpecIx, u64)> {
    let mut out: Vec<(SpecIx, u64)> = Vec::with_capacity(option.roles.len());
    for r in &option.roles {
        let u = u64::from(r.replicas) * u64::from(r.count_per_node);
        match out.iter_mut().find(|(s, _)| *s == r.spec) {
            Some((_, x)) => *x += u,
            None => out.push((r.spec, u)),
        }
    }
    out
}

/// The quota check for one option. `Ok` holds how the units will count.
pub(crate) fn check_quota(
    st: &mut State,
    a: &PendingAttempt,
    option: &GangOption,
) -> Result<Vec<UnitUse>, QuotaShort> {
    let q = &st.snap.quotas;
    let mut uses = Vec::with_capacity(option.roles.len() + 1);
    for (s, u) in option_units(option) {
        let cap = |st: &State, class: UsageClass, t: ResourceType| -> Result<(), QuotaShort> {
            if let Some(limit) = q.limit(a.group, t, a.pool, s) {
                let used = st.group_used(a.group, class, a.pool, s);
                if used + u > limit {
                    return Err(QuotaShort::Quota {
                        spec: s,
                        resource_type: t,
                        needs: u,
                        remaining: limit.saturating_sub(used),
                    });
                }
            }
            Ok(())
        };
        match a.resource_type {
            ResourceType::Reserved => {
                let limit = q.limit(a.group, ResourceType::Reserved, a.pool, s).unwrap_or(0);
                let remaining = limit.saturating_sub(st.group_used(a.group, UsageClass::Reserved, a.pool, s));
                if u <= remaining {
                    uses.push(UnitUse { spec: s, class: UsageClass::Reserved, units: u });
                } else if a.idle_supplement && !a.guarantee && u - remaining <= st.idle_available(a.pool, s) {
                    if remaining > 0 {
                        uses.push(UnitUse { spec: s, class: UsageClass::Reserved, units: remaining });
                    }
                    uses.push(UnitUse { spec: s, class: UsageClass::Borrowed, units: u - remaining });
                } else {
                    return Err(QuotaShort::Quota {
                        spec: s,
                        resource_type: ResourceType::Reserved,
                        needs: u,
                        remaining,
                    });
                }
            }
            ResourceType::Ondemand => {
                cap(st, UsageClass::Ondemand, ResourceType::Ondemand)?;
                let available = st.unreserved_units(a.pool, s).saturating_sub(st.class_used(
                    UsageClass::Ondemand,
                    a.pool,
                    s,
                ));
                if u > available {
                    return Err(QuotaShort::Unreserved { spec: s, needs: u, available });
                }
                uses.push(UnitUse { spec: s, class: UsageClass::Ondemand, units: u });
            }
            ResourceType::Spot => {
                cap(st, UsageClass::Spot, ResourceType::Spot)?;
                uses.push(UnitUse { spec: s, class: UsageClass::Spot, units: u });
            }
            ResourceType::Idle => {
                cap(st, UsageClass::Idle, ResourceType::Idle)?;
                let available = st.idle_available(a.pool, s);
                if u > available {
                    return Err(QuotaShort::Idle { spec: s, needs: u, available });
                }
                uses.push(UnitUse { spec: s, class: UsageClass::Idle, units: u });
            }
        }
    }
    Ok(uses)
}
