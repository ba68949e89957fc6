//! Scenario tests: a small fleet and queue built with a fixture, one scheduling cycle, and the plan rendered
//! as lines a person can read ("admit big (a100×8): n0 n1", "wait small #2/1: needs ..."), compared exactly.
//! Every plan is also run through `check_plan`.

use trainyard_core::demand::Resources;
use trainyard_core::spec::ResourceType::{self, *};
use trainyard_sched::*;

const GIB: u64 = 1024;

struct Fixture {
    b: SnapshotBuilder,
    next_id: u64,
}

/// (optional head (spec, count), worker spec, count per node, replicas).
type TaskOption = (Option<(&'static str, u32)>, &'static str, u32, u32);

struct Task {
    name: String,
    group: String,
    pool: String,
    rtype: ResourceType,
    priority: u32,
    submitted: u64,
    guarantee: bool,
    idle_supplement: bool,
    /// Options: (worker spec, count per node, workers), plus an optional head (spec, count) as a first role.
    options: Vec<TaskOption>,
    excluded: Vec<&'static str>,
}

impl Task {
    fn new(name: &str, group: &str, rtype: ResourceType) -> Self {
        Task {
            name: name.into(),
            group: group.into(),
            pool: "p".into(),
            rtype,
            priority: 5,
            submitted: 0,
            guarantee: false,
            idle_supplement: false,
            options: vec![],
            excluded: vec![],
        }
    }
    /// `replicas` replicas of `spec × count`.
    fn gang(mut self, spec: &'static str, count: u32, replicas: u32) -> Self {
        self.options.push((None, spec, count, replicas));
        self
    }
    fn ray(mut self, head: (&'static str, u32), spec: &'static str, count: u32, workers: u32) -> Self {
        self.options.push((Some(head), spec, count, workers));
        self
    }
    fn priority(mut self, p: u32) -> Self {
        self.priority = p;
        self
    }
    fn at(mut self, ms: u64) -> Self {
        self.submitted = ms;
        self
    }
    fn guarantee(mut self) -> Self {
        self.guarantee = true;
        self
    }
    fn idle_supplement(mut self) -> Self {
        self.idle_supplement = true;
        self
    }
    fn exclude(mut self, node: &'static str) -> Self {
        self.excluded.push(node);
        self
    }
}

impl Fixture {
    fn new() -> Self {
        let mut b = SnapshotBuilder::new();
        b.spec("a100", Some("A100"), Resources { gpus: 1, vcpus: 12, memory_mib: 100 * GIB });
        b.spec("h100", Some("H100"), Resources { gpus: 1, vcpus: 16, memory_mib: 150 * GIB });
        b.spec("cpu", None, Resources { gpus: 0, vcpus: 4, memory_mib: 16 * GIB });
        b.pool("p");
        for g in ["nlp", "vision"] {
            b.group(g);
        }
        Fixture { b, next_id: 1 }
    }

    /// `n` 8-GPU nodes of `model` (or 64-vCPU CPU nodes), named `prefix0`, `prefix1`, ...
    fn nodes(&mut self, prefix: &str, model: Option<&str>, n: usize) -> &mut Self {
        for i in 0..n {
            let cap = match model {
                Some(_) => Resources { gpus: 8, vcpus: 128, memory_mib: 1600 * GIB },
                None => Resources { gpus: 0, vcpus: 64, memory_mib: 256 * GIB },
            };
            self.b.node(&format!("{prefix}{i}"), "p", model, cap, true);
        }
        self
    }

    fn unschedulable(&mut self, name: &str, model: Option<&str>) -> &mut Self {
        let cap = Resources { gpus: 8, vcpus: 128, memory_mib: 1600 * GIB };
        self.b.node(name, "p", model, cap, false);
        self
    }

    fn quota(&mut self, group: &str, t: ResourceType, spec: &str, units: u64) -> &mut Self {
        let s = self.b.spec_ix(spec).unwrap();
        self.b.quota(group, t, "p", s, units);
        self
    }

    fn options(&mut self, t: &Task) -> Vec<GangOption> {
        t.options
            .iter()
            .map(|&(head, spec, count, replicas)| {
                let mut roles = Vec::new();
                if let Some((hs, hc)) = head {
                    roles.push(Role { spec: self.b.spec_ix(hs).unwrap(), count_per_node: hc, replicas: 1 });
                }
                roles.push(Role { spec: self.b.spec_ix(spec).unwrap(), count_per_node: count, replicas });
                GangOption { roles }
            })
            .collect()
    }

    fn pending(&mut self, t: Task) -> &mut Self {
        let options = self.options(&t);
        let id = AttemptId(self.next_id);
        self.next_id += 1;
        let group = self.b.group(&t.group);
        let pool = self.b.pool(&t.pool);
        let excluded = t.excluded.iter().map(|n| self.node_ix(n)).collect();
        self.b.pending(PendingAttempt {
            id,
            name: t.name.into(),
            group,
            pool,
            resource_type: t.rtype,
            guarantee: t.guarantee,
            idle_supplement: t.idle_supplement,
            priority: t.priority,
            submitted_at_ms: t.submitted,
            options: options.into(),
            excluded,
            nominated: vec![],
        });
        self
    }

    fn node_ix(&self, name: &str) -> NodeIx {
        let snap = self.peek();
        NodeIx(snap.nodes.iter().position(|n| n.name == name).unwrap() as u32)
    }

    fn peek(&self) -> Snapshot {
        self.b.clone().build()
    }

    /// A running attempt: its first option placed replica by replica on `nodes`, with its units as `class`.
    fn running(&mut self, t: Task, nodes: &[&str], class: UsageClass, stopping: bool) -> &mut Self {
        let options = self.options(&t);
        let option = &options[0];
        let snap = self.peek();
        let mut replicas = Vec::new();
        let mut k = 0;
        let mut units = Vec::new();
        for role in &option.roles {
            let need = snap.replica_need(role);
            for _ in 0..role.replicas {
                replicas.push(Replica { node: self.node_ix(nodes[k]), need });
                k += 1;
            }
            units.push(UnitUse {
                spec: role.spec,
                class,
                units: u64::from(role.replicas * role.count_per_node),
            });
        }
        assert_eq!(k, nodes.len(), "one node per replica");
        let id = AttemptId(self.next_id);
        self.next_id += 1;
        let group = self.b.group(&t.group);
        let pool = self.b.pool(&t.pool);
        self.b.running(RunningAttempt {
            id,
            name: t.name,
            group,
            pool,
            resource_type: t.rtype,
            priority: t.priority,
            started_at_ms: t.submitted,
            stopping,
            replicas,
            units,
        });
        self
    }

    fn run(&mut self, now: u64) -> Vec<String> {
        let snap = self.peek();
        check_snapshot(&snap).unwrap();
        let plan = schedule(&snap, now, &Config::default());
        if let Err(e) = check_plan(&snap, &plan) {
            panic!("plan breaks invariants: {e:#?}");
        }
        render(&snap, &plan)
    }
}

fn name_of(snap: &Snapshot, id: AttemptId) -> String {
    snap.pending
        .iter()
        .find(|a| a.id == id)
        .map(|a| a.name.to_string())
        .or_else(|| snap.running.iter().find(|a| a.id == id).map(|a| a.name.clone()))
        .unwrap()
}

fn render(snap: &Snapshot, plan: &Plan) -> Vec<String> {
    plan.decisions
        .iter()
        .map(|d| match d {
            Decision::Admit(a) => {
                let p = &snap.pending[a.pending_index];
                let option = &p.options[a.option];
                let specs: Vec<String> = option
                    .roles
                    .iter()
                    .map(|r| format!("{}×{}", snap.specs[r.spec.ix()].name, r.count_per_node))
                    .collect();
                let mut placements = a.placements.clone();
                placements.sort_by_key(|x| (x.role, x.replica));
                let nodes: Vec<&str> =
                    placements.iter().map(|x| snap.nodes[x.node.ix()].name.as_str()).collect();
                let how = if a.preemptible { " preemptible" } else { "" };
                format!("admit {} ({}){how}: {}", p.name, specs.join(" + "), nodes.join(" "))
            }
            Decision::Preempt(x) => {
                format!("preempt {} for {}", snap.running[x.running_index].name, name_of(snap, x.preemptor))
            }
            Decision::Wait(w) => {
                let p = &snap.pending[w.pending_index];
                let why = w.reason.describe(snap, p.group, |id| name_of(snap, id));
                format!("wait {} #{}/{}: {why}", p.name, w.position, w.position_in_group)
            }
        })
        .collect()
}

#[track_caller]
fn expect(got: Vec<String>, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    assert_eq!(got, want, "\n got:\n  {}\n", got.join("\n  "));
}

#[test]
fn gangs_are_all_or_nothing() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 64);
    f.pending(Task::new("three", "nlp", Reserved).gang("a100", 8, 3));
    f.pending(Task::new("two", "nlp", Reserved).gang("a100", 8, 2).at(1));
    expect(
        f.run(10),
        &[
            "admit two (a100×8): n0 n1",
            "wait three #1/1: needs 3 replicas of 8 A100 GPU, 96 vCPU, 800 GiB each; free capacity holds 0 now, largest free block is 0 A100 GPU, 32 vCPU, 800 GiB",
        ],
    );
}

#[test]
fn replicas_land_only_on_matching_healthy_unexcluded_nodes() {
    let mut f = Fixture::new();
    f.nodes("a", Some("A100"), 1).nodes("h", Some("H100"), 2).unschedulable("h-sick", Some("H100"));
    f.quota("nlp", Reserved, "h100", 64);
    f.pending(Task::new("t", "nlp", Reserved).gang("h100", 8, 2).exclude("h0"));
    expect(
        f.run(0),
        &[
            "wait t #1/1: needs 2 replicas of 8 H100 GPU, 128 vCPU, 1200 GiB each; free capacity holds 1 now, largest free block is 8 H100 GPU, 128 vCPU, 1600 GiB",
        ],
    );
    let mut f = Fixture::new();
    f.nodes("a", Some("A100"), 1).nodes("h", Some("H100"), 2).quota("nlp", Reserved, "h100", 64);
    f.pending(Task::new("t", "nlp", Reserved).gang("h100", 4, 3).exclude("h0"));
    expect(
        f.run(0),
        &[
            "wait t #1/1: needs 3 replicas of 4 H100 GPU, 64 vCPU, 600 GiB each; free capacity holds 2 now, largest free block is 8 H100 GPU, 128 vCPU, 1600 GiB",
        ],
    );
    let mut f = Fixture::new();
    f.nodes("a", Some("A100"), 1).nodes("h", Some("H100"), 2).quota("nlp", Reserved, "h100", 64);
    f.pending(Task::new("t", "nlp", Reserved).gang("h100", 4, 2).exclude("h0"));
    expect(f.run(0), &["admit t (h100×4): h1 h1"]);
}

#[test]
fn instance_specs_are_tried_in_order_and_the_first_admissible_wins() {
    let mut f = Fixture::new();
    f.nodes("a", Some("A100"), 2).quota("nlp", Reserved, "a100", 16).quota("nlp", Reserved, "h100", 16);
    f.pending(Task::new("t", "nlp", Reserved).gang("h100", 8, 1).gang("a100", 8, 2));
    expect(f.run(0), &["admit t (a100×8): a0 a1"]);
    // The first option wins when both fit.
    let mut f = Fixture::new();
    f.nodes("a", Some("A100"), 2).nodes("h", Some("H100"), 1);
    f.quota("nlp", Reserved, "a100", 16).quota("nlp", Reserved, "h100", 16);
    f.pending(Task::new("t", "nlp", Reserved).gang("h100", 8, 1).gang("a100", 8, 1));
    expect(f.run(0), &["admit t (h100×8): h0"]);
    // When no option fits, every option says why.
    let mut f = Fixture::new();
    f.nodes("a", Some("A100"), 1).quota("nlp", Reserved, "a100", 8);
    f.pending(Task::new("t", "nlp", Reserved).gang("h100", 8, 1).gang("a100", 8, 2));
    expect(
        f.run(0),
        &[
            "wait t #1/1: option 1 (h100): needs 8 units of h100 (Reserved); group nlp has 0 left; option 2 (a100): needs 16 units of a100 (Reserved); group nlp has 8 left",
        ],
    );
}

#[test]
fn reserved_quota_and_idle_supplementation() {
    // Group nlp has 8 reserved; vision reserved 16 and uses none of it.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 4).quota("nlp", Reserved, "a100", 8).quota("vision", Reserved, "a100", 16);
    f.pending(Task::new("over", "nlp", Reserved).gang("a100", 8, 2));
    f.pending(Task::new("borrow", "nlp", Reserved).gang("a100", 8, 2).idle_supplement().at(1));
    f.pending(
        Task::new("guaranteed", "nlp", Reserved).gang("a100", 8, 2).idle_supplement().guarantee().at(2),
    );
    expect(
        f.run(0),
        &[
            "admit borrow (a100×8) preemptible: n0 n3",
            "wait over #1/1: needs 16 units of a100 (Reserved); group nlp has 8 left",
            "wait guaranteed #3/3: needs 16 units of a100 (Reserved); group nlp has 0 left",
        ],
    );
}

#[test]
fn ondemand_uses_only_unreserved_capacity() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 3).quota("nlp", Reserved, "a100", 16);
    f.pending(Task::new("od1", "vision", Ondemand).gang("a100", 8, 1));
    f.pending(Task::new("od2", "vision", Ondemand).gang("a100", 8, 1).at(1));
    expect(
        f.run(0),
        &[
            "admit od1 (a100×8): n0",
            "wait od2 #2/2: needs 8 units of unreserved a100 capacity (Ondemand); the pool has 0 unreserved left",
        ],
    );
}

#[test]
fn spot_runs_anywhere_and_goes_first_when_reserved_work_needs_room() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 16);
    f.running(Task::new("spot-a", "vision", Spot).gang("a100", 8, 1), &["n0"], UsageClass::Spot, false);
    f.running(Task::new("spot-b", "vision", Spot).gang("a100", 4, 1), &["n1"], UsageClass::Spot, false);
    f.pending(Task::new("res", "nlp", Reserved).gang("a100", 8, 1));
    // Room on n1 needs only spot-b gone: one victim, the smaller loss.
    expect(
        f.run(0),
        &[
            "preempt spot-b for res",
            "wait res #1/1: waiting for preempted tasks to release their resources: spot-b",
        ],
    );
    // A Spot task never preempts.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 1);
    f.running(Task::new("spot-a", "vision", Spot).gang("a100", 8, 1), &["n0"], UsageClass::Spot, false);
    f.pending(Task::new("spot-b", "nlp", Spot).gang("a100", 8, 1));
    expect(
        f.run(0),
        &[
            "wait spot-b #1/1: needs 1 replica of 8 A100 GPU, 96 vCPU, 800 GiB each; free capacity holds 0 now, largest free block is 0 A100 GPU, 32 vCPU, 800 GiB",
        ],
    );
}

#[test]
fn idle_tasks_borrow_reservations_and_give_them_back() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 16);
    f.pending(Task::new("idle", "vision", Idle).gang("a100", 8, 2));
    f.pending(Task::new("too-big", "vision", Idle).gang("a100", 8, 3).at(1));
    expect(
        f.run(0),
        &[
            "admit idle (a100×8) preemptible: n0 n1",
            "wait too-big #2/2: needs 24 units of idle a100 capacity; 0 idle now",
        ],
    );
    // The owner comes back: the idle task goes, Spot first if there were any.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 16);
    f.running(Task::new("idle", "vision", Idle).gang("a100", 8, 2), &["n0", "n1"], UsageClass::Idle, false);
    f.pending(Task::new("owner", "nlp", Reserved).gang("a100", 8, 1));
    expect(
        f.run(0),
        &[
            "preempt idle for owner",
            "wait owner #1/1: waiting for preempted tasks to release their resources: idle",
        ],
    );
}

#[test]
fn victims_are_the_fewest_and_cheapest_that_really_make_room() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 3).quota("nlp", Reserved, "a100", 24);
    f.running(Task::new("idle0", "vision", Idle).gang("a100", 8, 1), &["n0"], UsageClass::Idle, false);
    f.running(
        Task::new("spot1", "vision", Spot).gang("a100", 2, 4),
        &["n1", "n1", "n1", "n1"],
        UsageClass::Spot,
        false,
    );
    f.running(Task::new("spot2a", "vision", Spot).gang("a100", 4, 1), &["n2"], UsageClass::Spot, false);
    f.running(Task::new("spot2b", "vision", Spot).gang("a100", 4, 1), &["n2"], UsageClass::Spot, false);
    f.pending(Task::new("res", "nlp", Reserved).gang("a100", 8, 1));
    // One Spot gang frees a whole node; Idle stays.
    expect(
        f.run(0),
        &[
            "preempt spot1 for res",
            "wait res #1/1: waiting for preempted tasks to release their resources: spot1",
        ],
    );
    // Two replicas need two nodes: spot1's node and then the cheapest of the rest.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 3).quota("nlp", Reserved, "a100", 24);
    f.running(Task::new("idle0", "vision", Idle).gang("a100", 8, 1), &["n0"], UsageClass::Idle, false);
    f.running(Task::new("spot1", "vision", Spot).gang("a100", 8, 1), &["n1"], UsageClass::Spot, false);
    f.running(Task::new("spot2", "vision", Spot).gang("a100", 4, 2), &["n2", "n2"], UsageClass::Spot, false);
    f.pending(Task::new("res", "nlp", Reserved).gang("a100", 8, 2));
    expect(
        f.run(0),
        &[
            "preempt spot1 for res",
            "preempt spot2 for res",
            "wait res #1/1: waiting for preempted tasks to release their resources: spot1, spot2",
        ],
    );
    // If the gang cannot fit even with every allowed victim gone, nobody is preempted.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 24).quota("vision", Reserved, "a100", 8);
    f.running(
        Task::new("theirs", "vision", Reserved).gang("a100", 8, 1),
        &["n0"],
        UsageClass::Reserved,
        false,
    );
    f.running(Task::new("spot", "vision", Spot).gang("a100", 8, 1), &["n1"], UsageClass::Spot, false);
    f.pending(Task::new("res", "nlp", Reserved).gang("a100", 8, 2));
    expect(
        f.run(0),
        &[
            "wait res #1/1: needs 2 replicas of 8 A100 GPU, 96 vCPU, 800 GiB each; free capacity holds 0 now, largest free block is 0 A100 GPU, 32 vCPU, 800 GiB",
        ],
    );
}

#[test]
fn already_stopping_victims_are_counted_on_not_preempted_again() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 1).quota("nlp", Reserved, "a100", 8);
    f.running(Task::new("spot", "vision", Spot).gang("a100", 8, 1), &["n0"], UsageClass::Spot, true);
    f.pending(Task::new("res", "nlp", Reserved).gang("a100", 8, 1));
    expect(f.run(0), &["wait res #1/1: waiting for preempted tasks to release their resources: spot"]);
}

#[test]
fn priority_within_a_group_and_its_reserved_quota() {
    // Higher priority first; FIFO among equals.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 1).quota("nlp", Reserved, "a100", 64);
    f.pending(Task::new("old-low", "nlp", Reserved).gang("a100", 8, 1).priority(3));
    f.pending(Task::new("new-high", "nlp", Reserved).gang("a100", 8, 1).priority(8).at(5));
    f.pending(Task::new("old-mid", "nlp", Reserved).gang("a100", 8, 1).priority(5).at(1));
    f.pending(Task::new("new-mid", "nlp", Reserved).gang("a100", 8, 1).priority(5).at(2));
    let got = f.run(10);
    assert_eq!(got[0], "admit new-high (a100×8): n0");
    assert!(got[1].starts_with("wait old-mid #2/2"), "{got:?}");
    assert!(got[2].starts_with("wait new-mid #3/3"), "{got:?}");
    assert!(got[3].starts_with("wait old-low #4/4"), "{got:?}");

    // A higher-priority task of the group takes the group's quota back from a lower-priority one.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 8);
    f.running(
        Task::new("low", "nlp", Reserved).gang("a100", 8, 1).priority(2),
        &["n0"],
        UsageClass::Reserved,
        false,
    );
    f.pending(Task::new("high", "nlp", Reserved).gang("a100", 8, 1).priority(9));
    expect(
        f.run(0),
        &[
            "preempt low for high",
            "wait high #1/1: waiting for preempted tasks to release their resources: low",
        ],
    );
    // ... but never one of another group, nor one of equal priority.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 8).quota("vision", Reserved, "a100", 8);
    f.running(
        Task::new("theirs", "vision", Reserved).gang("a100", 8, 1).priority(1),
        &["n0"],
        UsageClass::Reserved,
        false,
    );
    f.running(
        Task::new("ours", "nlp", Reserved).gang("a100", 8, 1).priority(9),
        &["n1"],
        UsageClass::Reserved,
        false,
    );
    f.pending(Task::new("high", "nlp", Reserved).gang("a100", 8, 1).priority(9));
    let got = f.run(0);
    assert_eq!(got, ["wait high #1/1: needs 8 units of a100 (Reserved); group nlp has 0 left"]);
}

#[test]
fn groups_take_turns_by_share() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 64).quota("vision", Reserved, "a100", 64);
    f.pending(Task::new("nlp-1", "nlp", Reserved).gang("a100", 8, 1));
    f.pending(Task::new("nlp-2", "nlp", Reserved).gang("a100", 8, 1).at(1));
    f.pending(Task::new("nlp-3", "nlp", Reserved).gang("a100", 8, 1).at(2));
    f.pending(Task::new("vision-1", "vision", Reserved).gang("a100", 8, 1).at(3));
    let got = f.run(10);
    assert_eq!(got[0], "admit nlp-1 (a100×8): n0");
    assert_eq!(got[1], "admit vision-1 (a100×8): n1", "vision's first task goes before nlp's second");
}

#[test]
fn a_starving_gang_gets_nodes_held_and_small_tasks_go_elsewhere() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 3).quota("nlp", Reserved, "a100", 64).quota("vision", Reserved, "a100", 64);
    // n0 and n1 are half full; n2 is busy.
    f.running(Task::new("r0", "vision", Reserved).gang("a100", 4, 1), &["n0"], UsageClass::Reserved, false);
    f.running(Task::new("r1", "vision", Reserved).gang("a100", 4, 1), &["n1"], UsageClass::Reserved, false);
    f.running(Task::new("r2", "vision", Reserved).gang("a100", 8, 1), &["n2"], UsageClass::Reserved, false);
    f.pending(Task::new("big", "nlp", Reserved).gang("a100", 8, 2).at(0));
    f.pending(Task::new("small", "vision", Reserved).gang("a100", 4, 1).at(400_000));
    // Before the threshold the small task takes a free half.
    let got = f.run(200_000);
    assert!(got.iter().any(|l| l.starts_with("admit small")), "{got:?}");
    // After it, the big gang holds n0 and n1: the small one waits behind it.
    let got = f.run(600_000);
    expect(
        got,
        &[
            "wait big #1/1: needs 2 replicas of 8 A100 GPU, 96 vCPU, 800 GiB each; free capacity holds 0 now, largest free block is 4 A100 GPU, 80 vCPU, 1200 GiB",
            "wait small #2/1: waiting behind big, which holds the nodes it needs",
        ],
    );
}

#[test]
fn a_starving_gang_its_quota_refuses_or_no_pool_could_take_holds_nothing() {
    let mut f;
    for (first, name, quota_units) in [("over-quota", "nlp", 8u64), ("too-big", "nlp", 64)] {
        f = Fixture::new();
        f.nodes("n", Some("A100"), 3)
            .quota(name, Reserved, "a100", quota_units)
            .quota("vision", Reserved, "a100", 64);
        // n0 is full; n1 and n2 are free.
        f.running(
            Task::new("r0", "vision", Reserved).gang("a100", 8, 1),
            &["n0"],
            UsageClass::Reserved,
            false,
        );
        // over-quota: 16 units against a quota of 8, never admitted whatever drains. too-big: 4 whole nodes
        // in a pool of 3, which no empty pool could take either.
        let replicas = if first == "too-big" { 4 } else { 2 };
        f.pending(Task::new(first, name, Reserved).gang("a100", 8, replicas).at(0));
        f.pending(Task::new("small", "vision", Reserved).gang("a100", 4, 1).at(400_000));
        // Long past the starvation threshold, nothing is held for it: the small task takes the free room.
        let got = f.run(600_000);
        assert!(got.iter().any(|l| l.starts_with("admit small")), "{first}: {got:?}");
        assert!(!got.iter().any(|l| l.contains("waiting behind")), "{first}: {got:?}");
    }
}

#[test]
fn ray_head_and_workers_on_their_own_specs() {
    let mut f = Fixture::new();
    f.nodes("g", Some("A100"), 1).nodes("c", None, 1);
    f.quota("nlp", Reserved, "a100", 8).quota("nlp", Reserved, "cpu", 4);
    f.pending(Task::new("ray", "nlp", Reserved).ray(("cpu", 2), "a100", 4, 2));
    expect(f.run(0), &["admit ray (cpu×2 + a100×4): c0 g0 g0"]);
    // Quota is counted per spec: the head's spec is short here.
    let mut f = Fixture::new();
    f.nodes("g", Some("A100"), 1).nodes("c", None, 1);
    f.quota("nlp", Reserved, "a100", 8).quota("nlp", Reserved, "cpu", 1);
    f.pending(Task::new("ray", "nlp", Reserved).ray(("cpu", 2), "a100", 4, 2));
    expect(f.run(0), &["wait ray #1/1: needs 2 units of cpu (Reserved); group nlp has 1 left"]);
}

#[test]
fn console_figures_come_from_the_same_state() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 3).quota("nlp", Reserved, "a100", 16).quota("vision", Reserved, "a100", 4);
    f.running(Task::new("r", "nlp", Reserved).gang("a100", 4, 1), &["n0"], UsageClass::Reserved, false);
    f.running(Task::new("s", "vision", Spot).gang("a100", 6, 1), &["n1"], UsageClass::Spot, false);
    let snap = f.peek();
    let (nlp, p, a100) = (GroupIx(0), PoolIx(0), SpecIx(0));
    assert_eq!(views::remaining_quota(&snap, nlp, Reserved, p, a100), Some(12));
    assert_eq!(views::remaining_quota(&snap, nlp, Spot, p, a100), None);
    assert_eq!(views::pool_available(&snap, p, a100), 4 + 2 + 8);
    // 20 reserved, 4 of them in use.
    assert_eq!(views::idle_quantity(&snap, p, a100), 16);
    // 24 units of capacity, 20 reserved.
    assert_eq!(views::unreserved_available(&snap, p, a100), 4);
    let frag = views::fragmentation(&snap, p, a100, 4);
    assert_eq!((frag.replicas_fit, frag.nodes_with_room), (3, 2));
    assert_eq!(frag.free_units_histogram.into_iter().collect::<Vec<_>>(), [(2, 1), (4, 1), (8, 1)]);

    let candidate = |units: u32| PendingAttempt {
        id: AttemptId(999),
        name: "new".into(),
        group: nlp,
        pool: p,
        resource_type: Reserved,
        guarantee: false,
        idle_supplement: false,
        priority: 5,
        submitted_at_ms: 0,
        options: vec![GangOption { roles: vec![Role { spec: a100, count_per_node: units, replicas: 1 }] }]
            .into(),
        excluded: vec![],
        nominated: vec![],
    };
    assert!(matches!(views::would_admit(&snap, candidate(8), 0, &Config::default()), Decision::Admit(_)));
    match views::would_admit(&snap, candidate(16), 0, &Config::default()) {
        Decision::Wait(w) => {
            assert_eq!(
                w.reason.describe(&snap, nlp, |_| String::new()),
                "needs 16 units of a100 (Reserved); group nlp has 12 left"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_wait_reason_reads_as_something_to_act_on() {
    // An explicit cap on a non-Reserved type.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Spot, "a100", 8);
    f.pending(Task::new("spot", "nlp", Spot).gang("a100", 8, 2));
    expect(f.run(0), &["wait spot #1/1: needs 16 units of a100 (Spot); group nlp has 8 left"]);
    // No node of the model at all.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 1).quota("nlp", Reserved, "h100", 8);
    f.pending(Task::new("h", "nlp", Reserved).gang("h100", 8, 1));
    expect(f.run(0), &["wait h #1/1: the pool has no schedulable H100 nodes"]);
    // CPU work goes to CPU nodes.
    let mut f = Fixture::new();
    f.nodes("g", Some("A100"), 1).nodes("c", None, 1).quota("nlp", Reserved, "cpu", 64);
    f.pending(Task::new("cpu", "nlp", Reserved).gang("cpu", 4, 2));
    expect(f.run(0), &["admit cpu (cpu×4): c0 c0"]);
}

/// `check_plan` must catch broken plans; otherwise every test that relies on it proves nothing.
#[test]
fn check_plan_catches_broken_plans() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).nodes("h", Some("H100"), 1).quota("nlp", Reserved, "a100", 8);
    f.running(Task::new("spot", "vision", Spot).gang("a100", 8, 1), &["n1"], UsageClass::Spot, false);
    f.running(Task::new("mine", "nlp", Reserved).gang("a100", 4, 1), &["n0"], UsageClass::Reserved, false);
    f.pending(Task::new("t", "nlp", Reserved).gang("a100", 4, 1).guarantee());
    let snap = f.peek();
    let plan = schedule(&snap, 0, &Config::default());
    check_plan(&snap, &plan).unwrap();
    let Decision::Admit(good) = plan.decisions[0].clone() else { panic!("{plan:?}") };

    let broken = |edit: &dyn Fn(&mut Admission), expect: &str| {
        let mut a = good.clone();
        edit(&mut a);
        let errors = check_plan(&snap, &Plan { decisions: vec![Decision::Admit(a)] }).unwrap_err();
        assert!(errors.iter().any(|e| e.contains(expect)), "{expect}: {errors:?}");
    };
    broken(&|a| a.placements[0].node = NodeIx(1), "over capacity");
    broken(&|a| a.placements[0].node = NodeIx(2), "does not match");
    broken(&|a| a.placements.clear(), "replicas missing");
    broken(&|a| a.units[0].units = 8, "do not match");
    broken(&|a| a.units[0].class = UsageClass::Borrowed, "Borrowed units");
    broken(
        &|a| {
            a.units[0].class = UsageClass::Borrowed;
            a.preemptible = true
        },
        "guaranteed task admitted on preemptible capacity",
    );
    broken(&|a| a.preemptible = true, "preemptible flag");
    broken(
        &|a| a.units = vec![UnitUse { spec: SpecIx(0), class: UsageClass::Reserved, units: 4 }; 2],
        "do not match",
    );

    // Quota: admitting it twice would use 12 of 8 units; and a second decision for one attempt.
    let errors =
        check_plan(&snap, &Plan { decisions: vec![Decision::Admit(good.clone()), Decision::Admit(good)] })
            .unwrap_err();
    assert!(errors.iter().any(|e| e.contains("over its quota")), "{errors:?}");
    assert!(errors.iter().any(|e| e.contains("got 2 decisions")), "{errors:?}");
    // Preempting a non-preemptible task of another group.
    let mut f2 = Fixture::new();
    f2.nodes("n", Some("A100"), 1).quota("nlp", Reserved, "a100", 8).quota("vision", Reserved, "a100", 8);
    f2.running(
        Task::new("theirs", "vision", Reserved).gang("a100", 8, 1),
        &["n0"],
        UsageClass::Reserved,
        false,
    );
    f2.pending(Task::new("t", "nlp", Reserved).gang("a100", 8, 1));
    let snap = f2.peek();
    let mut plan = schedule(&snap, 0, &Config::default());
    plan.decisions.push(Decision::Preempt(Preemption {
        victim: snap.running[0].id,
        running_index: 0,
        preemptor: snap.pending[0].id,
    }));
    let errors = check_plan(&snap, &plan).unwrap_err();
    assert!(errors.iter().any(|e| e.contains("may not preempt")), "{errors:?}");
    // A snapshot whose node usage disagrees with its replicas.
    let mut bad = snap.clone();
    bad.nodes[0].used.gpus = 3;
    assert!(check_snapshot(&bad).is_err());
}

#[test]
fn the_same_snapshot_gives_the_same_plan() {
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 3)
        .nodes("h", Some("H100"), 2)
        .quota("nlp", Reserved, "a100", 16)
        .quota("vision", Reserved, "h100", 16);
    f.running(Task::new("spot", "vision", Spot).gang("a100", 4, 2), &["n0", "n1"], UsageClass::Spot, false);
    for (i, name) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        f.pending(
            Task::new(
                name,
                if i % 2 == 0 { "nlp" } else { "vision" },
                if i % 2 == 0 { Reserved } else { Ondemand },
            )
            .gang("h100", 4, i as u32 + 1)
            .gang("a100", 4, i as u32 + 1)
            .at(i as u64),
        );
    }
    let snap = f.peek();
    let first = schedule(&snap, 100, &Config::default());
    for _ in 0..5 {
        assert_eq!(schedule(&snap, 100, &Config::default()), first);
    }
}

#[test]
fn a_preemptor_keeps_the_quota_it_counted_on() {
    // high needs 16 of the group's 16 units; low holds 8 of them. Preempting low covers the shortfall, and
    // the 8 units still free are kept for high: mid, after it in the queue, must not take them, or high would
    // need another victim next cycle, and so on.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 3).quota("nlp", Reserved, "a100", 16);
    f.running(
        Task::new("low", "nlp", Reserved).gang("a100", 8, 1).priority(1),
        &["n0"],
        UsageClass::Reserved,
        false,
    );
    f.pending(Task::new("high", "nlp", Reserved).gang("a100", 8, 2).priority(9));
    f.pending(Task::new("mid", "nlp", Reserved).gang("a100", 8, 1).priority(5));
    expect(
        f.run(0),
        &[
            "preempt low for high",
            "wait high #1/1: waiting for preempted tasks to release their resources: low",
            "wait mid #2/2: needs 8 units of a100 (Reserved); group nlp has 0 left",
        ],
    );
}

#[test]
fn quota_coming_back_from_stopping_work_is_counted_on() {
    // low is already stopping (preempted for high last cycle): high keeps waiting on it, with its nodes,
    // rather than falling back to "no quota" and losing its place to whoever comes next.
    let mut f = Fixture::new();
    f.nodes("n", Some("A100"), 2).quota("nlp", Reserved, "a100", 8);
    f.running(
        Task::new("low", "nlp", Reserved).gang("a100", 8, 1).priority(1),
        &["n0"],
        UsageClass::Reserved,
        true,
    );
    f.pending(Task::new("high", "nlp", Reserved).gang("a100", 8, 1).priority(9));
    expect(f.run(0), &["wait high #1/1: waiting for preempted tasks to release their resources: low"]);
}
