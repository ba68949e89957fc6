//! `trainyard run [OPTIONS] -- CMD ARGS...`: one command as a task, from a terminal or a script. The current
//! directory goes with it (`--workdir`), what it runs on comes from the options, the config file's
//! `defaults:`, or the first fit in the catalog for the caller's group; then every replica's output is
//! followed, and the exit status is the task's.

use crate::cli::{RunArgs, RunType};
use crate::conn::{CallResult, Conn, EXIT_REFUSED, usage};
use crate::logs::{LogOpts, logs};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::ExitCode;

/// What `run` may leave to the config file (`defaults:` in `~/.config/trainyard/config.yaml`).
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Defaults {
    pub group: Option<String>,
    pub pool: Option<String>,
    pub spec: Option<String>,
    pub image: Option<String>,
    pub resource_type: Option<String>,
}

/// Whether `run` makes a RayJob.
fn is_ray(o: &RunArgs) -> bool {
    o.task_type == RunType::Ray
}

/// `arg` as one word for `bash -c` (quoted unless it is plainly one).
fn quoted(arg: &str) -> String {
    let plain =
        !arg.is_empty() && arg.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%^".contains(&b));
    if plain { arg.to_owned() } else { format!("'{}'", arg.replace('\'', r"'\''")) }
}

/// The command line as the task's `cmd`: each argument one word, as an exec would pass it.
pub fn command_line(args: &[String]) -> String {
    args.iter().map(|a| quoted(a)).collect::<Vec<_>>().join(" ")
}

/// Where the task runs: group, resource type, pool, spec, image and placement.
#[derive(Debug, PartialEq, Eq)]
struct Choice {
    group: String,
    resource_type: String,
    pool: String,
    spec: String,
    image: String,
    region: String,
    cluster: String,
}

/// Picks what the options and defaults leave open from the catalog: the first quota line of the group that
/// fits (its spec has the GPUs asked for: none for `gpus` 0), and an image the group may use there (one with
/// Ray for a RayJob; `host` first where the group may use it).
fn choose(o: &RunArgs, d: &Defaults, me: &Value, cat: &Value) -> Result<Choice, String> {
    let admin = me["role"] == "admin";
    let my_groups: Vec<String> =
        me["groups"].as_array().into_iter().flatten().filter_map(|g| g.as_str().map(str::to_owned)).collect();
    let catalog_groups: Vec<String> =
        cat["projectGroups"].as_object().map(|m| m.keys().cloned().collect()).unwrap_or_default();
    let group = o
        .group
        .clone()
        .or_else(|| d.group.clone())
        .or_else(|| my_groups.first().cloned())
        .or_else(|| if admin { catalog_groups.first().cloned() } else { None })
        .ok_or("you are in no project group; ask an admin, or pass --group")?;
    let resource_type = o.resource_type.clone().or_else(|| d.resource_type.clone());
    let (pool, spec) = (o.pool.clone().or_else(|| d.pool.clone()), o.spec.clone().or_else(|| d.spec.clone()));
    let gpus_of = |s: &str| cat["instanceSpecs"][s]["gpus"].as_u64().unwrap_or(0);
    let lines: Vec<&Value> = cat["quotas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|q| q["group"] == group.as_str())
        .filter(|q| resource_type.as_deref().is_none_or(|r| q["resourceType"].as_str() == Some(r)))
        .filter(|q| pool.as_deref().is_none_or(|p| q["pool"].as_str() == Some(p)))
        .filter(|q| spec.as_deref().is_none_or(|s| q["spec"].as_str() == Some(s)))
        .collect();
    let fits = |q: &&Value| {
        let g = gpus_of(q["spec"].as_str().unwrap_or(""));
        if o.gpus == 0 { g == 0 } else { g >= u64::from(o.gpus) }
    };
    // With a spec named, it is taken as it is; else the fewest GPUs that fit, in the catalog's order.
    let line = if spec.is_some() {
        lines.first().copied()
    } else {
        lines.iter().copied().filter(fits).min_by_key(|q| gpus_of(q["spec"].as_str().unwrap_or("")))
    };
    let Some(line) = line else {
        let has: Vec<String> = cat["quotas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|q| q["group"] == group.as_str())
            .map(|q| {
                let s = q["spec"].as_str().unwrap_or("");
                format!(
                    "{} {} {s} ({} GPUs)",
                    q["resourceType"].as_str().unwrap_or(""),
                    q["pool"].as_str().unwrap_or(""),
                    gpus_of(s)
                )
            })
            .collect();
        return Err(format!(
            "project group {group} has no quota that fits{}{}; it has: {}",
            if o.gpus > 0 { format!(" {} GPUs a replica", o.gpus) } else { " a CPU-only replica".to_owned() },
            [resource_type.as_deref(), pool.as_deref(), spec.as_deref()]
                .iter()
                .flatten()
                .map(|v| format!(" with {v}"))
                .collect::<String>(),
            if has.is_empty() { "none".to_owned() } else { has.join(", ") }
        ));
    };
    let pool = line["pool"].as_str().unwrap_or("").to_owned();
    let cluster = cat["pools"][&pool]["cluster"].as_str().unwrap_or("").to_owned();
    let region = cat["clusters"][&cluster]["region"].as_str().unwrap_or("").to_owned();
    let usable = |name: &str, i: &Value| {
        let groups: Vec<&str> =
            i["projectGroups"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let clusters: Vec<&str> =
            i["clusters"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let for_group = if name == "host" {
            admin || groups.contains(&group.as_str())
        } else {
            groups.is_empty() || groups.contains(&group.as_str())
        };
        for_group
            && (clusters.is_empty() || clusters.contains(&cluster.as_str()))
            && (!is_ray(o) || i["ray"] == true)
    };
    let image = match o.image.clone().or_else(|| d.image.clone()) {
        Some(i) => i,
        None => {
            let images = cat["images"].as_object().cloned().unwrap_or_default();
            let host = images.get("host").filter(|i| usable("host", i)).map(|_| "host".to_owned());
            host.or_else(|| images.iter().find(|(n, i)| usable(n, i)).map(|(n, _)| n.clone())).ok_or_else(|| {
                format!(
                    "no catalog image {}is offered to project group {group} on cluster {cluster}; pass --image",
                    if is_ray(o) { "with Ray " } else { "" }
                )
            })?
        }
    };
    Ok(Choice {
        group,
        resource_type: line["resourceType"].as_str().unwrap_or("").to_owned(),
        pool,
        spec: line["spec"].as_str().unwrap_or("").to_owned(),
        image,
        region,
        cluster,
    })
}

/// The task document `run` submits.
fn document(o: &RunArgs, c: &Choice, cmd: &str) -> Value {
    let mut doc = json!({
        "apiVersion": "trainyard.dev/v1",
        "kind": "TrainingTask",
        "metadata": {"namePrefix": o.name_prefix.as_deref().unwrap_or("run"), "projectGroup": c.group},
        "spec": {
            "type": if is_ray(o) { "RayJob" } else { "PyTorchJob" },
            "placement": {"region": c.region, "cluster": c.cluster},
            "environment": {"image": c.image, "cmd": cmd},
            "compute": {
                "resourceType": c.resource_type,
                "pool": c.pool,
                "workers": o.workers,
                "instanceSpecs": [{"spec": c.spec}],
            },
        },
    });
    if let Some(n) = o.max_resubmissions {
        doc["spec"]["advanced"] = json!({"faultTolerance": {"enabled": true, "maxResubmissions": n}});
    }
    doc
}

pub fn run(conn: &Conn, o: &RunArgs, d: &Defaults) -> CallResult<ExitCode> {
    let args = &o.command;
    if args.is_empty() {
        return Err(usage("say what to run after --, for example: trainyard run -- python3 train.py"));
    }
    let (_, me) = conn.call("GET", "/api/v1/whoami", None, None)?;
    let (_, cat) = conn.call("GET", "/api/v1/catalog", None, None)?;
    let choice = choose(o, d, &me, &cat).map_err(usage)?;
    let mut doc = document(o, &choice, &command_line(args));
    if !o.no_workdir {
        let dir = o.workdir.clone().unwrap_or_else(|| PathBuf::from("."));
        let id = crate::client::upload_workdir(conn, &dir, &choice.group)?;
        doc["spec"]["environment"]["workdir"] = Value::String(id);
    }
    let body = serde_json::to_vec(&doc).map_err(|e| usage(e.to_string()))?;
    let (_, t) = conn.call("POST", "/api/v1/tasks", Some(&body), None)?;
    let (name, id) = (t["name"].as_str().unwrap_or("").to_owned(), t["id"].as_str().unwrap_or("").to_owned());
    eprintln!(
        "trainyard: {name}: {} on {} × {} ({} {}), image {}",
        if is_ray(o) { "RayJob" } else { "PyTorchJob" },
        choice.spec,
        1 + o.workers,
        choice.resource_type,
        choice.pool,
        choice.image
    );
    if o.detach {
        crate::conn::outln!("{name}");
        return Ok(ExitCode::SUCCESS);
    }
    let get = || conn.call("GET", &format!("/api/v1/tasks/{id}"), None, None).map(|(_, t)| t);
    let ended = |t: &Value| ["Succeeded", "Failed", "Stopped"].contains(&t["status"].as_str().unwrap_or(""));
    // Each attempt's output in turn, to the end of its replicas (an attempt that never started is passed
    // over); then the task has ended, or a resubmitted attempt is next.
    let mut attempt = 0i64;
    let task = 'attempts: loop {
        if crate::logs::wait_for_attempt(conn, &id, &name, Some(attempt))? {
            let follow = LogOpts { follow: true, all: true, attempt: Some(attempt), ..LogOpts::default() };
            logs(conn, &name, &follow)?;
        }
        loop {
            let t = get()?;
            let now = t["attempt"].as_i64().unwrap_or(0);
            if now > attempt {
                eprintln!(
                    "trainyard: {name}: attempt {attempt} ended and was resubmitted; following attempt {}",
                    attempt + 1
                );
                attempt += 1;
                continue 'attempts;
            }
            if ended(&t) {
                break 'attempts t;
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    };
    Ok(match task["status"].as_str().unwrap_or("") {
        "Succeeded" => ExitCode::SUCCESS,
        status => {
            let (_, ev) = conn.call("GET", &format!("/api/v1/tasks/{id}/events"), None, None)?;
            let attempt = task["attempt"].as_i64().unwrap_or(0);
            let stated = ev["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| e["attempt"].as_i64() == Some(attempt))
                .filter_map(|e| trainyard_core::failure::exit_code_in(e["message"].as_str().unwrap_or("")))
                .find(|c| *c != 0);
            let said = ev["items"]
                .as_array()
                .and_then(|v| v.last())
                .and_then(|e| e["message"].as_str())
                .unwrap_or("");
            eprintln!("trainyard: {name} {}: {said}", status.to_lowercase());
            match (status, stated) {
                ("Stopped", _) => ExitCode::from(EXIT_REFUSED),
                (_, Some(c)) => ExitCode::from(u8::try_from(c.clamp(1, 255)).unwrap_or(1)),
                _ => ExitCode::FAILURE,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_stay_words() {
        let args: Vec<String> =
            ["python3", "-c", "print(42)", "it's", ""].iter().map(|s| s.to_string()).collect();
        assert_eq!(command_line(&args), r#"python3 -c 'print(42)' 'it'\''s' ''"#);
    }

    fn catalog() -> Value {
        json!({
            "clusters": {"local": {"region": "local"}},
            "pools": {"default": {"cluster": "local", "instanceSpecs": ["gpu.1", "cpu.small"]}},
            "instanceSpecs": {"gpu.1": {"gpus": 1}, "cpu.small": {"gpus": 0}, "gpu.8": {"gpus": 8}},
            "projectGroups": {"default": {}, "nlp": {}},
            "images": {"host": {"projectGroups": ["default"]}, "torch": {}, "ray": {"ray": true}},
            "quotas": [
                {"group": "default", "resourceType": "Reserved", "pool": "default", "spec": "gpu.1", "units": 4},
                {"group": "default", "resourceType": "Reserved", "pool": "default", "spec": "cpu.small", "units": 4},
                {"group": "nlp", "resourceType": "Spot", "pool": "default", "spec": "gpu.8", "units": 1},
            ],
        })
    }

    #[test]
    fn the_first_fit_is_chosen_from_the_catalog() {
        let me = json!({"role": "member", "groups": ["default"]});
        let d = Defaults::default();
        let c = choose(&RunArgs::default(), &d, &me, &catalog()).unwrap();
        assert_eq!((c.spec.as_str(), c.image.as_str(), c.region.as_str()), ("cpu.small", "host", "local"));
        let c = choose(&RunArgs { gpus: 1, ..RunArgs::default() }, &d, &me, &catalog()).unwrap();
        assert_eq!(c.spec, "gpu.1");
        let c =
            choose(&RunArgs { task_type: RunType::Ray, ..RunArgs::default() }, &d, &me, &catalog()).unwrap();
        assert_eq!(c.image, "ray");
        // Another group: no host image (not offered), and only GPUs.
        let nlp = RunArgs { group: Some("nlp".into()), gpus: 2, ..RunArgs::default() };
        let c = choose(&nlp, &d, &me, &catalog()).unwrap();
        assert_eq!((c.spec.as_str(), c.resource_type.as_str(), c.image.as_str()), ("gpu.8", "Spot", "ray"));
        let err = choose(&RunArgs { group: Some("nlp".into()), ..RunArgs::default() }, &d, &me, &catalog())
            .unwrap_err();
        assert!(
            err.contains("no quota that fits a CPU-only replica; it has: Spot default gpu.8 (8 GPUs)"),
            "{err}"
        );
        // The config file's defaults count when the options say nothing.
        let d = Defaults { spec: Some("gpu.1".into()), image: Some("torch".into()), ..Defaults::default() };
        let c = choose(&RunArgs::default(), &d, &me, &catalog()).unwrap();
        assert_eq!((c.spec.as_str(), c.image.as_str()), ("gpu.1", "torch"));
    }
}
