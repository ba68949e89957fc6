//! The watches (kube-runtime's watcher: relists, backoff) on the jobs, their pods, the nodes and the events,
//! feeding the backend's [`State`]; the pod watch also starts each pod's log follower and metrics scraper.

use super::*;

pub(super) async fn watch_jobs(inner: std::sync::Weak<Inner>, kind: JobKind) {
    let Some(api) =
        inner.upgrade().map(|i| Api::<DynamicObject>::all_with(i.client.clone(), &views::job_resource(kind)))
    else {
        return;
    };
    let Some(selector) = inner.upgrade().map(|i| objects::instance_selector(&i.cfg.instance)) else { return };
    let cfg = watcher::Config::default().labels(&selector);
    let mut stream = watch(api, cfg).default_backoff().boxed();
    let mut listed: HashSet<AttemptKey> = HashSet::new();
    while let Some(ev) = stream.next().await {
        let Some(inner) = inner.upgrade() else { return };
        match ev {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(o)) => {
                if let Some(k) = job_seen(&inner, kind, &o) {
                    listed.insert(k);
                }
            }
            Ok(Event::InitDone) => {
                let mut s = inner.lock();
                let gone: Vec<AttemptKey> = s
                    .attempts
                    .iter()
                    .filter(|(k, a)| a.kind == Some(kind) && a.job.is_some() && !listed.contains(*k))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in gone {
                    if let Some(a) = s.attempts.get_mut(&k) {
                        a.job = None;
                    }
                    s.dirty.insert(k);
                }
                s.synced_kinds.insert(kind);
                s.synced_jobs = inner.kinds.iter().all(|k| s.synced_kinds.contains(k));
            }
            Ok(Event::Apply(o)) => {
                job_seen(&inner, kind, &o);
            }
            Ok(Event::Delete(o)) => {
                if let Some(k) = views::key_of(&o.metadata) {
                    let mut s = inner.lock();
                    if let Some(a) = s.attempts.get_mut(&k) {
                        a.job = None;
                        a.launched = false;
                        s.dirty.insert(k);
                    }
                }
            }
            Err(e) => eprintln!("trainyard: watching {}s: {e}", views::job_resource(kind).kind),
        }
    }
}

/// A job as the watch saw it; returns its attempt.
pub(super) fn job_seen(inner: &Inner, kind: JobKind, o: &DynamicObject) -> Option<AttemptKey> {
    let key = views::key_of(&o.metadata)?;
    let ns = o.metadata.namespace.clone().unwrap_or_default();
    let name = o.metadata.name.clone().unwrap_or_default();
    let settings = views::job_settings(&o.metadata);
    let mut s = inner.lock();
    let a = s.attempt(&key, &ns, &name);
    if a.job.is_none() && !a.launched {
        // Reattached after a restart: the settings come from the job.
        a.precheck = settings.precheck;
        a.pull_tolerance = settings.pull_tolerance;
        a.mount_paths = settings.mount_paths;
        a.retain = settings.retain;
        a.scrape = settings.scrape;
    }
    a.kind = Some(kind);
    a.launched = false;
    a.job = Some(views::job_view(o));
    Some(key)
}

pub(super) async fn watch_pods(inner: std::sync::Weak<Inner>) {
    let Some(api) = inner.upgrade().map(|i| Api::<Pod>::all(i.client.clone())) else { return };
    let Some(selector) = inner.upgrade().map(|i| objects::instance_selector(&i.cfg.instance)) else { return };
    let cfg = watcher::Config::default().labels(&selector);
    let mut stream = watch(api, cfg).default_backoff().boxed();
    let mut listed: HashSet<(AttemptKey, String)> = HashSet::new();
    while let Some(ev) = stream.next().await {
        let Some(inner) = inner.upgrade() else { return };
        match ev {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(p)) => {
                if let Some(k) = pod_seen(&inner, &p) {
                    listed.insert(k);
                }
            }
            Ok(Event::InitDone) => {
                let mut s = inner.lock();
                let gone: Vec<(AttemptKey, String, String)> = s
                    .attempts
                    .iter()
                    .flat_map(|(k, a)| {
                        a.pods
                            .keys()
                            .filter(|name| !listed.contains(&(k.clone(), (*name).clone())))
                            .map(|name| (k.clone(), a.namespace.clone(), name.clone()))
                    })
                    .collect();
                for (k, ns, name) in gone {
                    s.pod_gone(&k, &ns, &name);
                }
                s.synced_pods = true;
            }
            Ok(Event::Apply(p)) => {
                pod_seen(&inner, &p);
            }
            Ok(Event::Delete(p)) => {
                if let Some(k) = views::key_of(&p.metadata) {
                    let (ns, name) = (p.metadata.namespace.as_deref(), p.metadata.name.as_deref());
                    inner.lock().pod_gone(&k, ns.unwrap_or_default(), name.unwrap_or_default());
                }
            }
            Err(e) => eprintln!("trainyard: watching pods: {e}"),
        }
    }
}

pub(super) fn pod_seen(inner: &Arc<Inner>, p: &Pod) -> Option<(AttemptKey, String)> {
    let key = views::key_of(&p.metadata)?;
    let name = p.metadata.name.clone()?;
    let ns = p.metadata.namespace.clone().unwrap_or_default();
    let view = views::pod_view(p);
    let scrape = {
        let mut s = inner.lock();
        s.pod(&key, &ns, view.clone());
        s.attempts.get(&key).and_then(|a| a.scrape.clone())
    };
    capture_pod(inner, &key, &ns, &view, scrape);
    Some((key, name))
}

/// Starts following a pod's log once its main container has started, and scraping its metrics endpoints while
/// it runs (once each: a follower or scraper at work is left alone; a follower finds a log kept to its end in
/// the archive and stops there). Only while this server captures (it leads).
pub(super) fn capture_pod(
    inner: &Arc<Inner>,
    key: &AttemptKey,
    ns: &str,
    pod: &crate::status::PodView,
    scrape: Option<capture::Scrape>,
) {
    let Some((container, _)) = pod.containers.first() else { return };
    if !pod.started() || !inner.capturing.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let t = Target {
        key: key.clone(),
        namespace: ns.to_owned(),
        pod: pod.name.clone(),
        container: container.clone(),
        role: pod.role.clone(),
    };
    let running = pod.phase == "Running" && !pod.deleting;
    if pod.role == "head" {
        follow_driver(inner, key, ns, pod);
    }
    let scrape = scrape.filter(|_| running);
    let mut captures = inner.captures.lock().unwrap_or_else(|e| e.into_inner());
    if inner.capture_calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 1024 == 0 {
        // Now and then, not at every pod event: the handles of the finished ones go.
        captures.retain(|_, h| !h.is_finished());
    }
    let now = {
        let (w, key, name) = (Arc::downgrade(inner), key.clone(), pod.name.clone());
        move || pod_now(&w, &key, &name)
    };
    if let std::collections::hash_map::Entry::Vacant(slot) = captures.entry((t.clone(), false)) {
        // The exit checkpoint's steps, which the pod's preStop hook writes into the log, as events; only while a
        // stop Trainyard asked for is under way, so that a program's own output cannot pass for them.
        let hook: capture::LineHook = {
            let (w, key, name) = (Arc::downgrade(inner), key.clone(), pod.name.clone());
            Arc::new(move |text: &str| {
                let Some((reason, message)) = crate::objects::hook_line(text) else { return };
                let Some(inner) = w.upgrade() else { return };
                inner.lock().hook_said(&key, &name, reason, message);
            })
        };
        let task = capture::follow(
            inner.client.clone(),
            inner.archive.clone(),
            t.clone(),
            inner.telemetry.clone(),
            inner.log_streams.clone(),
            now.clone(),
            hook,
        );
        slot.insert(tokio::spawn(task));
    }
    if let Some(scrape) = scrape
        && !captures.contains_key(&(t.clone(), true))
    {
        let running = move || now() == PodNow::Runs;
        let task = capture::scrape(
            inner.client.clone(),
            inner.archive.clone(),
            t.clone(),
            scrape,
            inner.telemetry.clone(),
            running,
        );
        captures.insert((t, true), tokio::spawn(task));
    }
}

/// Starts following a RayJob's driver output from its head's dashboard once the head has started (once: a
/// follower at work is left alone, and one finds a driver log kept to its end in the archive and stops).
fn follow_driver(inner: &Arc<Inner>, key: &AttemptKey, ns: &str, head: &crate::status::PodView) {
    let job = {
        let s = inner.lock();
        s.attempts.get(key).filter(|a| a.kind == Some(JobKind::Ray)).map(|a| a.job_name.clone())
    };
    let Some(job) = job else { return };
    let driver = objects::driver_replica_name(&job);
    let t = Target {
        key: key.clone(),
        namespace: ns.to_owned(),
        pod: driver.clone(),
        container: "driver".into(),
        role: "driver".into(),
    };
    let mut captures = inner.captures.lock().unwrap_or_else(|e| e.into_inner());
    if captures.contains_key(&(t.clone(), false)) {
        return;
    }
    let head_now = {
        let (w, key, name) = (Arc::downgrade(inner), key.clone(), head.name.clone());
        move || pod_now(&w, &key, &name)
    };
    let task = capture::follow_driver(
        inner.client.clone(),
        inner.archive.clone(),
        t.clone(),
        head.name.clone(),
        job,
        inner.telemetry.clone(),
        head_now,
    );
    captures.insert((t, false), tokio::spawn(task));
}

/// Where a pod is, as the watches last saw it.
pub(super) fn pod_now(inner: &std::sync::Weak<Inner>, key: &AttemptKey, name: &str) -> PodNow {
    let Some(inner) = inner.upgrade() else { return PodNow::Gone };
    let s = inner.lock();
    match s.attempts.get(key).and_then(|a| a.pods.get(name)) {
        None => PodNow::Gone,
        Some(p) => {
            let main_ended = p
                .containers
                .first()
                .is_some_and(|(_, c)| matches!(c, crate::status::ContainerState::Terminated { .. }));
            if main_ended || matches!(p.phase.as_str(), "Succeeded" | "Failed") {
                PodNow::Ended
            } else {
                PodNow::Runs
            }
        }
    }
}

/// Kubernetes events about the attempts' jobs and pods become their `ClusterEvent`s. Only events that happen
/// while this server watches: the first listing (older events, already reported by an earlier server or
/// gone) is skipped, and an event seen again (its count grew) is not repeated.
pub(super) async fn watch_events(inner: std::sync::Weak<Inner>) {
    use k8s_openapi::api::core::v1::Event as KubeEvent;
    let Some(api) = inner.upgrade().map(|i| Api::<KubeEvent>::all(i.client.clone())) else { return };
    let mut stream = watch(api, watcher::Config::default()).default_backoff().boxed();
    let mut seen: HashSet<String> = HashSet::new();
    let mut listing = true;
    while let Some(ev) = stream.next().await {
        let Some(inner) = inner.upgrade() else { return };
        match ev {
            Ok(Event::Init) => listing = true,
            Ok(Event::InitApply(e)) => {
                seen.extend(e.metadata.uid.clone());
            }
            Ok(Event::InitDone) => listing = false,
            Ok(Event::Apply(e)) if !listing => {
                let Some(uid) = e.metadata.uid.clone() else { continue };
                if !seen.insert(uid) {
                    continue;
                }
                if seen.len() > 100_000 {
                    seen.clear();
                }
                let o = &e.involved_object;
                let (Some(ns), Some(name)) = (o.namespace.as_deref(), o.name.as_deref()) else { continue };
                let message = format!(
                    "{} {}/{}: {} {}",
                    e.type_.as_deref().unwrap_or("Normal"),
                    o.kind.as_deref().unwrap_or("object"),
                    name,
                    e.reason.as_deref().unwrap_or(""),
                    e.message.as_deref().unwrap_or("").trim()
                );
                // Kueue says why it holds a job on the job's Workload: that is the job's wait.
                let about = match o.kind.as_deref() {
                    Some("Workload") => crate::views::workload_job(name).unwrap_or(name),
                    _ => name,
                };
                inner.lock().cluster_event(ns, about, message);
            }
            Ok(_) => {}
            Err(e) => eprintln!("trainyard: watching events: {e}"),
        }
    }
}

/// Pods Trainyard did not make (DaemonSets, monitoring agents, other workloads): what each holds of its node,
/// so that the catalog offers only the room left ([`State::effective`]). Selected by the managed-by label
/// (so another Trainyard server's pods on a shared cluster are not counted either).
pub(super) async fn watch_foreign_pods(inner: std::sync::Weak<Inner>) {
    let Some(api) = inner.upgrade().map(|i| Api::<Pod>::all(i.client.clone())) else { return };
    let selector = format!("{}!={}", objects::MANAGED_BY_LABEL, objects::MANAGED_BY);
    let cfg = watcher::Config::default().labels(&selector);
    let mut stream = watch(api, cfg).default_backoff().boxed();
    let mut listed: HashMap<String, (String, u64, u64)> = HashMap::new();
    while let Some(ev) = stream.next().await {
        let Some(inner) = inner.upgrade() else { return };
        let changed = match ev {
            Ok(Event::Init) => {
                listed.clear();
                false
            }
            Ok(Event::InitApply(p)) => {
                if let (Some(uid), Some(claim)) = (p.metadata.uid.clone(), views::pod_claim(&p)) {
                    listed.insert(uid, claim);
                }
                false
            }
            Ok(Event::InitDone) => inner.lock().foreign_pods(std::mem::take(&mut listed)),
            Ok(Event::Apply(p)) => match p.metadata.uid.as_deref() {
                Some(uid) => inner.lock().foreign_pod(uid, views::pod_claim(&p)),
                None => false,
            },
            Ok(Event::Delete(p)) => match p.metadata.uid.as_deref() {
                Some(uid) => inner.lock().foreign_pod(uid, None),
                None => false,
            },
            Err(e) => {
                eprintln!("trainyard: watching other pods: {e}");
                false
            }
        };
        if changed {
            inner.inventory_changed.notify_one();
        }
    }
}

pub(super) async fn watch_nodes(inner: std::sync::Weak<Inner>) {
    let Some(api) = inner.upgrade().map(|i| Api::<Node>::all(i.client.clone())) else { return };
    let mut stream = watch(api, watcher::Config::default()).default_backoff().boxed();
    let mut listed: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut listed_nodes = BTreeMap::new();
    let mut listed_raw = BTreeMap::new();
    while let Some(ev) = stream.next().await {
        let Some(inner) = inner.upgrade() else { return };
        match ev {
            Ok(Event::Init) => {
                listed.clear();
                listed_nodes.clear();
                listed_raw.clear();
            }
            Ok(Event::InitApply(n)) => {
                listed.insert(n.metadata.name.clone().unwrap_or_default(), views::node_down(&n));
                if let Some((name, node)) = views::catalog_node(&n) {
                    listed_raw.insert(name.clone(), (node.clone(), views::node_room(&n)));
                    listed_nodes.insert(name, node);
                }
            }
            Ok(Event::InitDone) => {
                let mut s = inner.lock();
                let known: Vec<String> = s.nodes_down.keys().cloned().collect();
                for name in known {
                    if !listed.contains_key(&name) {
                        s.node(&name, Some("was deleted".to_owned()), true, wall_ms());
                    }
                }
                for (name, down) in std::mem::take(&mut listed) {
                    s.node(&name, down, false, wall_ms());
                }
                s.raw_nodes = std::mem::take(&mut listed_raw);
                let names: Vec<String> = listed_nodes.keys().cloned().collect();
                s.inventory = Some(std::mem::take(&mut listed_nodes));
                s.refresh_nodes(names.iter().map(String::as_str));
                s.inventory_version += 1;
                inner.inventory_changed.notify_one();
            }
            Ok(Event::Apply(n)) => {
                let mut s = inner.lock();
                s.node(
                    n.metadata.name.as_deref().unwrap_or_default(),
                    views::node_down(&n),
                    false,
                    wall_ms(),
                );
                if let Some((name, node)) = views::catalog_node(&n) {
                    s.raw_nodes.insert(name.clone(), (node, views::node_room(&n)));
                    if s.refresh_nodes([name.as_str()]) {
                        inner.inventory_changed.notify_one();
                    }
                }
            }
            Ok(Event::Delete(n)) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                let mut s = inner.lock();
                s.node(&name, Some("was deleted".to_owned()), true, wall_ms());
                s.raw_nodes.remove(&name);
                if s.inventory.as_mut().is_some_and(|inv| inv.remove(&name).is_some()) {
                    s.inventory_version += 1;
                    inner.inventory_changed.notify_one();
                }
            }
            Err(e) => eprintln!("trainyard: watching nodes: {e}"),
        }
    }
}
