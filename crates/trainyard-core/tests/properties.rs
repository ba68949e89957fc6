//! Property tests.
//!
//! (a) A generator of *valid* tasks against the example catalog, covering both task types and every
//! optional section. Each generated task validates with no problem at all (no error, no warning), and reads
//! back unchanged from its own YAML and JSON. String fields that the rules leave free (descriptions, env
//! values, commands, mount paths, metrics paths, webhooks) are drawn from arbitrary Unicode and from
//! strings that YAML treats specially (`null`, `1e3`, `- x`, `a #b`, line breaks, ...), so the round trip
//! exercises the serialiser's quoting.
//!
//! (b) No input makes `check` panic, hang or come back empty-handed: arbitrary bytes and strings, mutated
//! example files, an oversized document, YAML alias bombs and deeply nested documents.

// Tests are the shell: they read the shipped examples and time runs.
#![allow(clippy::disallowed_methods)]

use proptest::collection::{btree_set, vec};
use proptest::prelude::*;
use proptest::sample::{Index, select, subsequence};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};
use trainyard_core::catalog::{ClusterScoped, InstanceKind};
use trainyard_core::spec::{
    API_VERSION, Advanced, AlarmEvent, AlarmSubscription, Autoscaling, AutoscalingMode, CheckpointSignal,
    Compute, DatasetMount, EnvVar, Environment, ExitCheckpoint, FaultTolerance, InstanceSpecChoice, KIND,
    Metadata, MetricsEndpoint, MetricsMonitor, ModelMount, Placement, Precheck, PyTorchSettings, RayDebug,
    RayHead, RaySettings, ResourceType, SharedStorage, TaskSpec, TaskType, TrainingTask, VolumeMount,
};
use trainyard_core::validate::limits::COUNT_PER_NODE_MAX;
use trainyard_core::validate::{RESERVED_ENV, RESERVED_ENV_PREFIX};
use trainyard_core::{Catalog, Checked, Code, MAX_DOCUMENT_BYTES, check, parse, validate};

// ---------------------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------------------

static CATALOG: LazyLock<Catalog> = LazyLock::new(|| {
    Catalog::from_yaml(include_str!("../../../examples/catalog/catalog.yaml"))
        .expect("the example catalog loads")
});

fn cat() -> &'static Catalog {
    &CATALOG
}

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Every `.yaml` file under `examples/`, recursively, in name order.
static EXAMPLES: LazyLock<Vec<(String, Vec<u8>)>> = LazyLock::new(|| {
    fn walk(dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|e| e == "yaml") {
                out.push((p.display().to_string(), std::fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&examples_dir(), &mut out);
    assert!(out.len() >= 6, "expected the shipped examples under {}", examples_dir().display());
    out
});

fn example(name: &str) -> String {
    std::fs::read_to_string(examples_dir().join(name)).unwrap()
}

fn config(cases: u32) -> ProptestConfig {
    // No regression files: this file is the only thing the tests write to, and failures are reported with
    // their minimal input in the panic message.
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

fn render(problems: &[trainyard_core::Problem]) -> String {
    problems.iter().map(|p| format!("  {p}\n")).collect()
}

// ---------------------------------------------------------------------------------------------------------
// Text
// ---------------------------------------------------------------------------------------------------------

/// Strings that a YAML emitter must quote or escape to keep them strings, and that a YAML reader might
/// otherwise take for something else.
#[rustfmt::skip]
const TRICKY: &[&str] = &[
    "", "true", "false", "True", "FALSE", "null", "Null", "NULL", "~", "yes", "no", "Yes", "NO", "on", "off",
    "On", "OFF", "y", "n", "Y", "N", "0", "1", "-1", "+1", "007", "08", "0x1F", "0o17", "0b101", "1_000",
    "1e3", "1E-3", "-1.5e+10", "1.5", ".5", "5.", ".inf", "-.Inf", "+.INF", ".nan", ".NaN", "inf", "nan",
    "1:30", "1:30:00", "2001-12-14", "2001-12-14t21:59:43.10-05:00", "<<", "=", "- x", "-x", "-", "--", "---",
    "...", "--- x", "? x", "?", ": x", ":", "a: b", "a:b", "a #b", "a#b", "#x", "# x", "&a", "*a", "!tag",
    "!!str x", "%YAML 1.2", "@x", "`x", "|", "|-", ">", ">+", "'", "''", "\"", "\"\"", "{", "}", "{}", "[",
    "]", "[]", ",", "a, b", "{a: b}", "[a, b]", " lead", "trail ", "  both  ", " ", "\t", "\ttab", "tab\t",
    "line1\nline2", "trailing newline\n", "\n", "\n\n", "\nlead", "a\r\nb", "\r", "a\rb", "a\u{85}b",
    "a\u{2028}b", "a\u{2029}b", "\u{FEFF}", "\u{FEFF}bom", "nbsp\u{a0}", "\u{a0}", "é", "学习", "😀", "\\",
    "\\n", "\\u0041", "\u{7f}", "\u{1b}[0m", "\u{80}", "\u{9f}", "\u{fffd}", "\u{ffff}", "\u{10ffff}",
    "a\u{200b}b", "\u{e000}",
];

/// Characters with a meaning in YAML or JSON, or that are line breaks or odd spaces somewhere.
#[rustfmt::skip]
const SPECIAL_CHARS: &[char] = &[
    '\n', '\r', '\t', ' ', '#', ':', '-', '?', '\'', '"', '\\', '{', '}', '[', ']', ',', '&', '*', '!', '|',
    '>', '<', '%', '@', '`', '~', '=', '.', '\u{85}', '\u{2028}', '\u{2029}', '\u{FEFF}', '\u{a0}', '\u{7f}',
    '\u{1b}', '\u{0b}', '\u{0c}', '\u{8}', '\u{80}', '\u{9f}', '\u{3000}', '\u{fffe}', '\u{ffff}',
];

fn text_char() -> impl Strategy<Value = char> {
    prop_oneof![4 => any::<char>(), 2 => select(SPECIAL_CHARS), 2 => prop::char::range('a', 'z')]
}

/// Any string (NUL included), of up to `max` characters when drawn character by character.
fn any_text(max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        4 => vec(text_char(), 0..max).prop_map(String::from_iter),
        2 => select(TRICKY).prop_map(str::to_owned),
        2 => vec(select(TRICKY), 1..5).prop_map(|v| v.concat()),
        // Long lines with runs of spaces: an emitter that folds long lines must keep every space.
        1 => "([a-z]{1,8} {1,3}){10,40}",
        1 => "[ -~]{0,80}",
        1 => "([ -~]{0,30}\n){1,6}",
    ]
    .boxed()
}

/// A string without NUL that is not blank (`cmd`, env values).
fn non_blank_text(max: usize) -> impl Strategy<Value = String> {
    any_text(max).prop_map(|s| {
        let mut s = s.replace('\0', "");
        if s.trim().is_empty() {
            s.push('x');
        }
        s
    })
}

// ---------------------------------------------------------------------------------------------------------
// Catalog helpers
// ---------------------------------------------------------------------------------------------------------

/// The largest `countPerNode` of `spec` that some node of `pool` can hold, capped by the limit; with no
/// nodes known for the pool, the limit itself. 0 when no node could hold one unit.
fn max_fit(pool: &str, spec: &str) -> u32 {
    let s = &cat().instance_specs[spec];
    let mut nodes = cat().pool_nodes(pool).peekable();
    if nodes.peek().is_none() {
        return COUNT_PER_NODE_MAX;
    }
    let per = |have: u64, need: u64| have.checked_div(need).unwrap_or(u64::MAX);
    let best = nodes
        .filter(|(_, n)| n.gpu_model == s.gpu_model)
        .map(|(_, n)| {
            per(n.gpus.into(), s.gpus.into())
                .min(per(n.vcpus.into(), s.vcpus.into()))
                .min(per(n.memory_mib, s.memory_mib))
        })
        .max()
        .unwrap_or(0);
    u32::try_from(best.min(u64::from(COUNT_PER_NODE_MAX))).unwrap()
}

/// The specs of `pool` that fit at least once on one of its nodes, with their largest count.
fn placeable_specs(pool: &str) -> Vec<(String, u32)> {
    cat().pools[pool]
        .instance_specs
        .iter()
        .map(|s| (s.clone(), max_fit(pool, s)))
        .filter(|(_, n)| *n > 0)
        .collect()
}

fn cluster_of(pool: &str) -> String {
    cat().pools[pool].cluster.clone()
}

fn offered<T: ClusterScoped>(items: &BTreeMap<String, T>, cluster: &str) -> Vec<String> {
    items.iter().filter(|(_, v)| v.offered_in(cluster)).map(|(n, _)| n.clone()).collect()
}

// ---------------------------------------------------------------------------------------------------------
// Metadata
// ---------------------------------------------------------------------------------------------------------

/// Valid label values that YAML would read as something else when left unquoted.
#[rustfmt::skip]
const TRICKY_LABEL_VALUES: &[&str] = &[
    "true", "false", "True", "null", "Null", "NULL", "yes", "no", "on", "off", "y", "n", "Y", "N", "0", "1",
    "007", "08", "0x1F", "0o17", "0b1", "1_000", "1e3", "1E3", "1.5", "1.0", "1.2.3", "NaN", "nan", "inf",
    "Infinity", "2001-12-14",
];

fn name_prefix() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9]([a-z0-9-]{0,55}[a-z0-9])?",
        1 => select(&["true", "null", "yes", "no", "on", "off", "y", "n", "0", "123", "007", "1e3", "0x1f",
            "nan", "inf", "1-2", "2001-12-14"][..]).prop_map(str::to_owned),
    ]
}

fn label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just(String::new()),
        3 => "[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?",
        2 => select(TRICKY_LABEL_VALUES).prop_map(str::to_owned),
    ]
}

/// Labels from the catalog's maintained set (label validation is on), each with an allowed value.
fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    let per_key: Vec<BoxedStrategy<Option<(String, String)>>> = cat()
        .labels
        .maintained
        .iter()
        .map(|(k, allowed)| {
            let k = k.clone();
            let value =
                if allowed.is_empty() { label_value().boxed() } else { select(allowed.clone()).boxed() };
            prop::option::of(value.prop_map(move |v| (k.clone(), v))).boxed()
        })
        .collect();
    per_key.prop_map(|kvs| kvs.into_iter().flatten().collect())
}

fn metadata() -> impl Strategy<Value = Metadata> {
    let groups: Vec<String> = cat().project_groups.keys().cloned().collect();
    (name_prefix(), select(groups), any::<bool>(), labels(), prop::option::of(any_text(200))).prop_map(
        |(name_prefix, project_group, public, labels, description)| Metadata {
            name_prefix,
            project_group,
            public,
            labels,
            description,
        },
    )
}

// ---------------------------------------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------------------------------------

fn env_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[A-Za-z_][A-Za-z0-9_]{0,15}",
        1 => select(&["true", "null", "yes", "no", "on", "off", "y", "n", "Y", "N", "NULL", "_", "__", "inf",
            "nan", "e1", "rank", "master_addr", "TRAINYARD", "X_USER", "RAY"][..]).prop_map(str::to_owned),
    ]
    .prop_filter("a name the platform sets", |n| {
        !RESERVED_ENV.contains(&n.as_str()) && !n.starts_with(RESERVED_ENV_PREFIX)
    })
}

/// A list of variables with distinct names, in any order, some hidden.
fn env_list(max: usize) -> impl Strategy<Value = Vec<EnvVar>> {
    btree_set(env_name(), 0..=max)
        .prop_flat_map(|names| {
            let n = names.len();
            (Just(names), vec((non_blank_text(60), any::<bool>()), n))
        })
        .prop_map(|(names, values)| {
            names
                .into_iter()
                .zip(values)
                // A hidden value made only of `*` reads as the mask the API shows in its place, which a
                // submission may not send as a value: such a pair is no valid task, so none is generated.
                .map(|(name, (value, hidden))| {
                    let hidden = hidden && !trainyard_core::validate::is_mask(&value);
                    EnvVar { name, value, hidden }
                })
                .collect::<Vec<_>>()
        })
        .prop_shuffle()
}

/// External image references (`[host[:port]/]path[:tag][@digest]`), some of which YAML would misread.
fn external_image() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        Just(String::new()),
        select(&["registry.example.com/", "localhost/", "localhost:5000/", "ghcr.io/", "10.0.0.1:443/"][..])
            .prop_map(str::to_owned),
        // A port is 1 to 65535 (0 is no port).
        "[a-z0-9]{1,8}\\.[a-z]{2,4}(:[1-9][0-9]{0,3})?/",
    ];
    let first = "[a-z0-9]([a-z0-9_-]{0,10}[a-z0-9])?";
    let rest = vec("/[a-z0-9]([a-z0-9._-]{0,10}[a-z0-9])?", 0..3).prop_map(|v| v.concat());
    let tag = prop::option::of("[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}");
    let digest = prop::option::of("[0-9a-f]{64}");
    prop_oneof![
        4 => (host, first, rest, tag, digest).prop_map(|(h, f, r, t, d)| {
            let mut s = format!("{h}{f}{r}");
            if let Some(t) = t {
                s.push(':');
                s.push_str(&t);
            }
            if let Some(d) = d {
                s.push_str("@sha256:");
                s.push_str(&d);
            }
            s
        }),
        1 => select(&["null", "true", "yes", "off", "y", "1.0", "123", "0x1f", "1e3", "inf", "nan"][..])
            .prop_map(str::to_owned),
    ]
}

fn image(tt: TaskType, cluster: &str) -> BoxedStrategy<String> {
    let in_catalog: Vec<String> = cat()
        .images
        .iter()
        .filter(|(_, i)| i.offered_in(cluster) && (tt != TaskType::RayJob || i.ray))
        .map(|(n, _)| n.clone())
        .collect();
    assert!(!in_catalog.is_empty(), "the example catalog offers a {tt} image in {cluster}");
    // A RayJob on an external image gets a warning (its Ray runtime cannot be checked): catalog images only.
    if tt == TaskType::PyTorchJob && cat().allow_external_images {
        prop_oneof![select(in_catalog), external_image()].boxed()
    } else {
        select(in_catalog).boxed()
    }
}

/// A character allowed in a mount path segment (no control characters, `:`, `,`, `\` or `/`).
fn path_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => prop::char::range('a', 'z'),
        2 => select(&['-', '_', '.', ' ', '#', '&', '*', '!', '|', '>', '%', '@', '\'', '"', '{', '}', '[',
            ']', '?', '=', '+', '~', '$', '`', '\u{85}', '\u{2028}', '\u{FEFF}', '\u{a0}', '\u{3000}', 'é',
            '学'][..]),
        1 => any::<char>(),
    ]
    .prop_filter("not allowed in a mount path", |c| !c.is_control() && !matches!(c, ':' | ',' | '\\' | '/'))
}

fn path_segment() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => vec(path_char(), 1..10).prop_map(String::from_iter),
        1 => select(&["true", "null", "1", "1e3", "~", "-", "- x", "a #b", "...", "---", " ", "  lead",
            "trail ", ".hidden", "..x", "x.."][..]).prop_map(str::to_owned),
    ]
    .prop_filter("a . or .. segment", |s| s != "." && s != "..")
}

/// Where a mount goes and what it mounts.
#[derive(Debug, Clone)]
enum MountKind {
    Volume(Index, bool),
    Dataset(Index),
    Model(Index),
}

/// Volumes, datasets and models offered in `cluster`, at distinct mount paths under /mnt or /volume,
/// none inside another (each has its own first segment under its root).
fn mounts(
    cluster: &str,
) -> impl Strategy<Value = (Vec<VolumeMount>, Vec<DatasetMount>, Vec<ModelMount>)> + use<> {
    let volumes = offered(&cat().volumes, cluster);
    let datasets = offered(&cat().datasets, cluster);
    let models = offered(&cat().models, cluster);
    let mut kinds: Vec<BoxedStrategy<MountKind>> = Vec::new();
    if !volumes.is_empty() {
        kinds.push((any::<Index>(), any::<bool>()).prop_map(|(i, ro)| MountKind::Volume(i, ro)).boxed());
    }
    if !datasets.is_empty() {
        kinds.push(any::<Index>().prop_map(MountKind::Dataset).boxed());
    }
    if !models.is_empty() {
        kinds.push(any::<Index>().prop_map(MountKind::Model).boxed());
    }
    let kind = proptest::strategy::Union::new(kinds);
    let heads = btree_set((select(&["/mnt", "/volume"][..]), path_segment()), 0..=8);
    heads
        .prop_flat_map(move |heads| {
            let n = heads.len();
            let heads: Vec<_> = heads.into_iter().collect();
            (Just(heads).prop_shuffle(), vec((vec(path_segment(), 0..3), kind.clone()), n))
        })
        .prop_map(move |(heads, rest)| {
            let (mut vs, mut ds, mut ms) = (Vec::new(), Vec::new(), Vec::new());
            for ((root, first), (more, kind)) in heads.into_iter().zip(rest) {
                let mut mount_path = format!("{root}/{first}");
                for seg in more {
                    mount_path.push('/');
                    mount_path.push_str(&seg);
                }
                match kind {
                    MountKind::Volume(i, read_only) => {
                        vs.push(VolumeMount { volume: i.get(&volumes).clone(), mount_path, read_only })
                    }
                    MountKind::Dataset(i) => ds.push(DatasetMount {
                        dataset: i.get(&datasets).clone(),
                        mount_path,
                        read_only: true,
                    }),
                    MountKind::Model(i) => {
                        ms.push(ModelMount { model: i.get(&models).clone(), mount_path, read_only: true })
                    }
                }
            }
            (vs, ds, ms)
        })
}

// ---------------------------------------------------------------------------------------------------------
// Compute
// ---------------------------------------------------------------------------------------------------------

fn workers() -> impl Strategy<Value = u32> {
    prop_oneof![4 => 0u32..8, 1 => 0u32..=4095]
}

/// Resource type, guarantee (Reserved and Ondemand only) and idle supplement (Reserved only, and not with
/// guarantee).
fn resource_type() -> impl Strategy<Value = (ResourceType, bool, bool)> {
    (select(ResourceType::ALL), any::<bool>(), any::<bool>()).prop_map(|(rt, g, i)| {
        let guarantee = g && matches!(rt, ResourceType::Reserved | ResourceType::Ondemand);
        let idle_supplement = i && rt == ResourceType::Reserved && !guarantee;
        (rt, guarantee, idle_supplement)
    })
}

/// One instance spec choice from those `pool` offers, with a count some node can hold.
fn one_spec(pool: &str) -> impl Strategy<Value = InstanceSpecChoice> + use<> {
    select(placeable_specs(pool))
        .prop_flat_map(|(spec, max)| (Just(spec), 1..=max))
        .prop_map(|(spec, count_per_node)| InstanceSpecChoice { spec, count_per_node })
}

/// Instance specs offered by `pool`, all of one kind (mixing GPU and CPU is a warning), no duplicates, in
/// any order, each with a count some node of the pool can hold.
fn instance_specs(pool: &str) -> impl Strategy<Value = Vec<InstanceSpecChoice>> + use<> {
    let mut by_kind: BTreeMap<InstanceKind, Vec<(String, u32)>> = BTreeMap::new();
    for (s, max) in placeable_specs(pool) {
        by_kind.entry(cat().instance_specs[&s].kind).or_default().push((s, max));
    }
    let groups: Vec<Vec<(String, u32)>> = by_kind.into_values().collect();
    assert!(!groups.is_empty(), "pool {pool} offers a spec that fits its nodes");
    select(groups)
        .prop_flat_map(|group| {
            let n = group.len();
            subsequence(group, 1..=n).prop_shuffle()
        })
        .prop_flat_map(|chosen| {
            chosen
                .into_iter()
                .map(|(spec, max)| {
                    (1..=max).prop_map(move |n| InstanceSpecChoice { spec: spec.clone(), count_per_node: n })
                })
                .collect::<Vec<_>>()
        })
}

fn compute<W: Strategy<Value = u32>>(pool: &str, workers: W) -> impl Strategy<Value = Compute> + use<W> {
    let pool_name = pool.to_owned();
    (resource_type(), workers, instance_specs(pool), 1u32..=10).prop_map(
        move |((resource_type, guarantee, idle_supplement), workers, instance_specs, priority)| Compute {
            resource_type,
            pool: pool_name.clone(),
            workers,
            instance_specs,
            guarantee,
            priority,
            idle_supplement,
        },
    )
}

/// `procsPerNode`: at most the GPUs of every GPU choice (more is a warning: processes would share GPUs).
fn pytorch_settings(c: &Compute) -> BoxedStrategy<Option<PyTorchSettings>> {
    let max = c
        .instance_specs
        .iter()
        .filter_map(|ch| {
            let s = &cat().instance_specs[&ch.spec];
            (s.kind == InstanceKind::Gpu).then(|| s.gpus.saturating_mul(ch.count_per_node))
        })
        .min()
        .unwrap_or(256)
        .min(256);
    prop::option::of(prop::option::of(1..=max).prop_map(|procs_per_node| PyTorchSettings { procs_per_node }))
        .boxed()
}

// ---------------------------------------------------------------------------------------------------------
// Advanced
// ---------------------------------------------------------------------------------------------------------

fn positive_f64() -> impl Strategy<Value = f64> {
    use prop::num::f64 as f;
    prop_oneof![
        2 => 0.001f64..10_000.0,
        2 => f::POSITIVE | f::NORMAL | f::SUBNORMAL,
        1 => select(&[0.1, 0.2, 0.3, 1.0, 50.0, 200.0, 1e-7, 1e21, 1e300, 5e-324, f64::MAX, f64::MIN_POSITIVE,
            f64::EPSILON, 123_456_789.123_456_79, 9_007_199_254_740_993.0][..]),
    ]
}

fn precheck() -> impl Strategy<Value = Precheck> {
    (
        any::<bool>(),
        env_list(3),
        prop::option::of(positive_f64()),
        prop::option::of(positive_f64()),
        1u32..=3600,
    )
        .prop_map(|(enabled, env, min_gemm_tflops, min_allreduce_gbps, timeout_seconds)| Precheck {
            enabled,
            env,
            min_gemm_tflops,
            min_allreduce_gbps,
            timeout_seconds,
        })
}

fn fault_tolerance() -> impl Strategy<Value = FaultTolerance> {
    (any::<bool>(), 0u32..=100, any::<bool>()).prop_map(|(enabled, max_resubmissions, node_replacement)| {
        FaultTolerance { enabled, max_resubmissions, node_replacement }
    })
}

fn exit_checkpoint() -> impl Strategy<Value = ExitCheckpoint> {
    (any::<bool>(), 1u32..=600, select(CheckpointSignal::ALL))
        .prop_map(|(enabled, timeout_seconds, signal)| ExitCheckpoint { enabled, timeout_seconds, signal })
}

/// A metrics path: `/` then no whitespace, control character or `#`; at most 256 bytes.
fn metrics_path() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => Just("/metrics".to_owned()),
        3 => vec(
            prop_oneof![3 => prop::char::range('a', 'z'), 1 => select(&['/', ':', '-', '?', '&', '*', '!', '|',
                '>', '%', '@', '\'', '"', '{', '}', '[', ']', ',', '=', '~', '`', '\u{FEFF}', 'é', '学'][..]),
                1 => any::<char>()],
            0..30,
        )
        .prop_map(|cs| {
            let tail: String =
                cs.into_iter().filter(|c| !c.is_whitespace() && !c.is_control() && *c != '#').collect();
            format!("/{tail}")
        }),
    ]
}

fn metrics() -> impl Strategy<Value = MetricsMonitor> {
    any::<bool>()
        .prop_flat_map(|enabled| {
            let min = usize::from(enabled);
            let endpoints = btree_set((1u32..=65535, metrics_path()), min..=4)
                .prop_map(|s| s.into_iter().collect::<Vec<_>>())
                .prop_shuffle();
            (Just(enabled), endpoints, 5u32..=3600)
        })
        .prop_map(|(enabled, endpoints, interval_seconds)| MetricsMonitor {
            enabled,
            endpoints: endpoints.into_iter().map(|(port, path)| MetricsEndpoint { port, path }).collect(),
            interval_seconds,
        })
}

/// An https webhook: a host, maybe a port and user info, and a path with no whitespace or control characters.
fn webhook() -> impl Strategy<Value = String> {
    let host = prop_oneof![
        Just("alerts.example.com".to_owned()),
        "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\\.[a-z]{2,6}){1,2}",
        Just("10.1.2.3".to_owned()),
        Just("[::1]".to_owned()),
    ];
    let user = prop::option::of(select(&["user@", "user:pw@", "a%40b@"][..]));
    let port = prop::option::of(1u16..);
    let path = vec(
        prop_oneof![3 => prop::char::range('a', 'z'), 1 => select(&['/', '?', '#', '&', '=', ':', '@', '%', '-',
            '\'', '"', '{', '}', '[', ']', ',', '*', '!', '|', '>', '~', '`', 'é', '学'][..]),
            1 => any::<char>()],
        0..40,
    )
    .prop_map(|cs| cs.into_iter().filter(|c| !c.is_whitespace() && !c.is_control()).collect::<String>());
    (user, host, port, path).prop_map(|(user, host, port, path)| {
        let port = port.map(|p| format!(":{p}")).unwrap_or_default();
        format!("https://{}{host}{port}/{path}", user.unwrap_or(""))
    })
}

/// An alarm subscription: distinct events, and a threshold of at least 60 s exactly when `queuedTooLong`
/// is subscribed.
fn alarm() -> impl Strategy<Value = AlarmSubscription> {
    (
        subsequence(AlarmEvent::ALL, 1..=AlarmEvent::ALL.len()).prop_shuffle(),
        webhook(),
        prop_oneof![3 => 60u32..=86_400, 1 => 60u32..],
    )
        .prop_map(|(events, webhook, threshold)| {
            let queued_threshold_seconds = events.contains(&AlarmEvent::QueuedTooLong).then_some(threshold);
            AlarmSubscription { events, webhook, queued_threshold_seconds }
        })
}

fn advanced(tt: TaskType) -> impl Strategy<Value = Advanced> {
    let pytorch = tt == TaskType::PyTorchJob;
    // The precheck and the exit checkpoint apply to PyTorchJob only.
    let precheck = if pytorch { prop::option::of(precheck()).boxed() } else { Just(None).boxed() };
    let exit_checkpoint =
        if pytorch { prop::option::of(exit_checkpoint()).boxed() } else { Just(None).boxed() };
    (
        precheck,
        prop::option::of(fault_tolerance()),
        exit_checkpoint,
        prop::option::of(metrics()),
        -1i64..=100,
        any::<bool>(),
        vec(alarm(), 0..=3),
    )
        .prop_map(
            |(
                precheck,
                fault_tolerance,
                exit_checkpoint,
                metrics,
                image_pull_tolerance,
                passwordless_ssh,
                alarms,
            )| {
                Advanced {
                    precheck,
                    fault_tolerance,
                    exit_checkpoint,
                    metrics,
                    image_pull_tolerance,
                    passwordless_ssh,
                    alarms,
                }
            },
        )
}

// ---------------------------------------------------------------------------------------------------------
// Ray
// ---------------------------------------------------------------------------------------------------------

/// A string value for a runtime env: printable, quoted when rendered.
fn ray_string() -> impl Strategy<Value = String> {
    prop_oneof!["[A-Za-z0-9_.=<>~!/ -]{1,20}", select(TRICKY_LABEL_VALUES).prop_map(str::to_owned)]
}

fn ray_requirements() -> impl Strategy<Value = serde_json::Value> {
    let list = vec("[a-z][a-z0-9-]{0,10}(==[0-9]\\.[0-9]{1,2}(\\.[0-9])?)?", 0..4);
    prop_oneof![
        list.clone().prop_map(serde_json::Value::from),
        Just(serde_json::Value::from("/mnt/code/requirements.txt")),
        (list, prop::option::of(any::<bool>()), prop::option::of(select(&["==23.0", "==24.1.2"][..])))
            .prop_map(|(packages, check, version)| {
                let mut m = serde_json::Map::new();
                m.insert("packages".into(), packages.into());
                if let Some(c) = check {
                    m.insert("CHECK".into(), c.into());
                }
                if let Some(v) = version {
                    m.insert("VERSION".into(), v.into());
                }
                serde_json::Value::Object(m)
            }),
    ]
}

/// A small, valid Ray runtime env as YAML text (or a blank one, which means none), in one of three styles:
/// one JSON document, one line per field with flow values, or block YAML as serde-saphyr writes it.
fn runtime_env_yaml() -> impl Strategy<Value = String> {
    use serde_json::{Map, Value};
    let env_vars = prop::collection::btree_map(env_name(), ray_string(), 0..4);
    let config = (prop::option::of(prop_oneof![Just(-1i64), 1i64..=3600]), prop::option::of(any::<bool>()));
    let manager = prop_oneof![Just(0u8), Just(1u8), Just(2u8), Just(3u8), Just(4u8)];
    let body = (
        manager,
        ray_requirements(),
        prop::option::of(env_vars),
        config,
        prop::option::of(select(&["/mnt/code", "s3://bucket/code.zip", "."][..])),
        prop::option::of(vec(ray_string(), 0..3)),
        prop::option::of(select(&["default", "mod.setup_fn"][..])),
    )
        .prop_map(|(manager, reqs, env_vars, (timeout, eager), working_dir, excludes, hook)| {
            let mut m = Map::new();
            // 0: nothing, 1: pip, 2: uv, 3: conda, 4: image_uri (which allows only config and env_vars).
            match manager {
                1 | 2 => {
                    let which = if manager == 1 { "pip" } else { "uv" };
                    let reqs = match reqs {
                        Value::Object(o) => Value::Object(
                            o.into_iter()
                                .map(|(k, v)| match k.as_str() {
                                    "CHECK" => (format!("{which}_check"), v),
                                    "VERSION" => (format!("{which}_version"), v),
                                    _ => (k, v),
                                })
                                .collect(),
                        ),
                        other => other,
                    };
                    m.insert(which.into(), reqs);
                }
                3 => {
                    m.insert("conda".into(), Value::from("my-env"));
                }
                4 => {
                    m.insert("image_uri".into(), Value::from("registry.example.com/ray:2.9"));
                }
                _ => {}
            }
            if let Some(e) = env_vars {
                m.insert(
                    "env_vars".into(),
                    Value::Object(e.into_iter().map(|(k, v)| (k, v.into())).collect()),
                );
            }
            let mut cfg = Map::new();
            if let Some(t) = timeout {
                cfg.insert("setup_timeout_seconds".into(), t.into());
            }
            if let Some(e) = eager {
                cfg.insert("eager_install".into(), e.into());
            }
            if !cfg.is_empty() {
                m.insert("config".into(), Value::Object(cfg));
            }
            if manager != 4 {
                if let Some(w) = working_dir {
                    m.insert("working_dir".into(), w.into());
                }
                if let Some(x) = excludes {
                    m.insert("excludes".into(), x.into());
                }
                if let Some(h) = hook {
                    m.insert("worker_process_setup_hook".into(), h.into());
                }
            }
            m
        });
    let style = 0u8..3;
    let before = select(&["", "", "\n", "# runtime env\n", "---\n"][..]);
    let after = select(&["", "\n", "\n", "\n\n", "  \n", "\n# end\n"][..]);
    prop_oneof![
        1 => select(&["", " ", "\n", "{}", "null", "~"][..]).prop_map(str::to_owned),
        6 => (body, style, before, after).prop_map(|(m, style, before, after)| {
            let text = match style {
                0 => serde_json::to_string(&m).unwrap(),
                1 => m.iter().map(|(k, v)| format!("{k}: {v}\n")).collect(),
                _ => serde_saphyr::to_string(&m).unwrap(),
            };
            format!("{before}{text}{after}")
        }),
    ]
}

fn autoscaling_bounds() -> impl Strategy<Value = (u32, u32)> {
    prop_oneof![4 => (0u32..=8, 0u32..=8), 1 => (0u32..=4095, 0u32..=4095)]
        .prop_map(|(a, b)| (a.min(b), a.max(b).max(1)))
}

/// Compute and Ray settings for a RayJob: the head spec from the pool's offers, shared storage on a
/// multi-pod read-write volume offered in the cluster, and workers inside the autoscaling range.
fn ray_compute(pool: &str) -> impl Strategy<Value = (Compute, Option<RaySettings>)> + use<> {
    let pool = pool.to_owned();
    let cluster = cluster_of(&pool);
    let shared: Vec<String> = cat()
        .volumes
        .iter()
        .filter(|(_, v)| v.multi_pod_read_write && v.offered_in(&cluster))
        .map(|(n, _)| n.clone())
        .collect();
    let shared_storage = if shared.is_empty() {
        Just(None).boxed()
    } else {
        prop::option::of(
            (select(shared), any::<bool>())
                .prop_map(|(volume, cleanup_on_exit)| SharedStorage { volume, cleanup_on_exit }),
        )
        .boxed()
    };
    let rest = (
        prop::option::of(one_spec(&pool)),
        prop::option::of(runtime_env_yaml()),
        shared_storage,
        prop::option::of(
            (any::<bool>(), 1u32..=86_400)
                .prop_map(|(enabled, retention_seconds)| RayDebug { enabled, retention_seconds }),
        ),
        (any::<bool>(), 1u32..=86_400, select(AutoscalingMode::ALL)),
    );
    (any::<bool>(), prop::option::of(autoscaling_bounds()), rest).prop_flat_map(
        move |(has_ray, bounds, (head, runtime_env_yaml, shared_storage, debug, (enabled, idle, mode)))| {
            let bounds = bounds.filter(|_| has_ray);
            let workers = match bounds {
                Some((min, max)) => (min..=max).boxed(),
                None => workers().boxed(),
            };
            let ray = has_ray.then(|| RaySettings {
                head: RayHead { instance_spec: head },
                runtime_env_yaml,
                shared_storage,
                debug,
                autoscaling: bounds.map(|(min_workers, max_workers)| Autoscaling {
                    enabled,
                    min_workers,
                    max_workers,
                    idle_timeout_seconds: idle,
                    mode,
                }),
            });
            (compute(&pool, workers), Just(ray))
        },
    )
}

// ---------------------------------------------------------------------------------------------------------
// The task
// ---------------------------------------------------------------------------------------------------------

type Specific = (Compute, Option<PyTorchSettings>, Option<RaySettings>);

fn type_specific(tt: TaskType, pool: &str) -> BoxedStrategy<Specific> {
    match tt {
        TaskType::PyTorchJob => compute(pool, workers())
            .prop_flat_map(|c| {
                let settings = pytorch_settings(&c);
                (Just(c), settings)
            })
            .prop_map(|(c, p)| (c, p, None))
            .boxed(),
        TaskType::RayJob => ray_compute(pool).prop_map(|(c, r)| (c, None, r)).boxed(),
    }
}

/// A valid task of type `tt` in `pool`.
fn task_in(tt: TaskType, pool: &str) -> impl Strategy<Value = TrainingTask> + use<> {
    let cluster = cluster_of(pool);
    let region = cat().clusters[&cluster].region.clone();
    (
        metadata(),
        image(tt, &cluster),
        env_list(6),
        mounts(&cluster),
        non_blank_text(120),
        type_specific(tt, pool),
        advanced(tt),
    )
        .prop_map(move |(metadata, image, env, (volumes, datasets, models), cmd, specific, advanced)| {
            let (compute, pytorch, ray) = specific;
            TrainingTask {
                api_version: API_VERSION.to_owned(),
                kind: KIND.to_owned(),
                metadata,
                spec: TaskSpec {
                    task_type: tt,
                    placement: Placement { region: region.clone(), cluster: cluster.clone() },
                    environment: Environment { image, env, volumes, datasets, models, cmd, workdir: None },
                    compute,
                    advanced,
                    pytorch,
                    ray,
                },
            }
        })
}

/// A valid task against the example catalog: either task type, in any pool. (A union of one strategy per
/// type and pool rather than a flat map, so that each is built once and failures shrink within one.)
fn valid_task() -> impl Strategy<Value = TrainingTask> {
    let mut each = Vec::new();
    for tt in TaskType::ALL {
        for pool in cat().pools.keys() {
            each.push(task_in(*tt, pool).boxed());
        }
    }
    proptest::strategy::Union::new(each)
}

// ---------------------------------------------------------------------------------------------------------
// (a) Valid tasks validate clean and round-trip
// ---------------------------------------------------------------------------------------------------------

/// The lines of the two tasks' debug forms that differ, for a readable failure message.
fn diff(sent: &TrainingTask, got: &TrainingTask) -> String {
    let (a, b) = (format!("{sent:#?}"), format!("{got:#?}"));
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    let mut out = String::new();
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i).map(|l| l.trim()), b.get(i).map(|l| l.trim()));
        if x != y {
            out.push_str(&format!("  sent: {}\n  got:  {}\n", x.unwrap_or("(end)"), y.unwrap_or("(end)")));
            if out.len() > 2000 {
                break;
            }
        }
    }
    out
}

fn reparse(text: &str, via: &str, task: &TrainingTask) -> Result<(), TestCaseError> {
    let (back, d) = parse(text.as_bytes());
    prop_assert!(
        d.report.problems.is_empty(),
        "{via} of a valid task does not parse clean:\n{}--- {via}:\n{text}",
        render(&d.report.problems)
    );
    let back = back.expect("a task when there are no problems");
    prop_assert!(
        back == *task,
        "{via} round trip changes the task:\n{}--- {via}:\n{text}",
        diff(task, &back)
    );
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn generated_tasks_validate_with_no_problems(task in valid_task()) {
        let report = validate(&task, cat());
        let report = fits_or_never(report);
        prop_assert!(
            report.problems.is_empty(),
            "a valid task got problems:\n{}--- task:\n{:#?}",
            render(&report.problems),
            task
        );
    }

    #[test]
    fn generated_tasks_round_trip_through_yaml(task in valid_task()) {
        let yaml = task.to_yaml();
        reparse(&yaml, "YAML", &task)?;
        // And end to end: the YAML checks clean against the catalog.
        let checked = check(yaml.as_bytes(), cat());
        let report = fits_or_never(checked.report);
        prop_assert!(report.problems.is_empty(), "{}", render(&report.problems));
    }

    // Fails at the time of writing: serde_json, built without its `float_roundtrip` feature, reads some
    // floats (precheck.minGemmTflops, minAllreduceGbps) one ULP off what `to_json` wrote.
    #[test]
    fn generated_tasks_round_trip_through_json(task in valid_task()) {
        reparse(&task.to_json(), "JSON", &task)?;
    }
}

/// A generated task is valid in every field but may ask for more than the example catalog's quota or nodes
/// could ever give (the admission check's `never-fits` at `spec.compute.instanceSpecs`, tested on its own in
/// the validator's tests): that one problem is left out here.
fn fits_or_never(mut report: trainyard_core::Report) -> trainyard_core::Report {
    report.problems.retain(|p| !(p.code == Code::NeverFits && p.path == "spec.compute.instanceSpecs"));
    report
}

/// The generator reaches every section it is meant to cover (so a weakened strategy cannot pass quietly).
#[test]
fn the_generator_covers_every_section() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let strategy = valid_task();
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..256 {
        let t = strategy.new_tree(&mut runner).unwrap().current();
        let s = &t.spec;
        let a = &s.advanced;
        let mut mark = |cond: bool, what: &'static str| {
            if cond {
                seen.insert(what);
            }
        };
        mark(s.task_type == TaskType::PyTorchJob, "PyTorchJob");
        mark(s.task_type == TaskType::RayJob, "RayJob");
        mark(t.metadata.description.is_some(), "description");
        mark(!t.metadata.labels.is_empty(), "labels");
        mark(s.environment.env.iter().any(|v| v.hidden), "hidden env");
        mark(!s.environment.volumes.is_empty(), "volumes");
        mark(!s.environment.datasets.is_empty(), "datasets");
        mark(!s.environment.models.is_empty(), "models");
        mark(!cat().images.contains_key(&s.environment.image), "external image");
        for rt in ResourceType::ALL {
            mark(s.compute.resource_type == *rt, rt.as_str());
        }
        mark(s.compute.guarantee, "guarantee");
        mark(s.compute.idle_supplement, "idleSupplement");
        mark(s.compute.instance_specs.len() > 1, "several instance specs");
        mark(a.precheck.as_ref().is_some_and(|p| p.min_gemm_tflops.is_some()), "precheck");
        mark(a.fault_tolerance.is_some(), "faultTolerance");
        mark(a.exit_checkpoint.is_some(), "exitCheckpoint");
        mark(a.metrics.as_ref().is_some_and(|m| !m.endpoints.is_empty()), "metrics");
        mark(a.alarms.iter().any(|x| x.queued_threshold_seconds.is_some()), "queuedTooLong");
        mark(s.pytorch.as_ref().is_some_and(|p| p.procs_per_node.is_some()), "procsPerNode");
        let ray = s.ray.as_ref();
        mark(ray.is_some_and(|r| r.head.instance_spec.is_some()), "ray head");
        mark(ray.is_some_and(|r| r.runtime_env_yaml.as_deref().is_some_and(|y| y.len() > 10)), "runtimeEnv");
        mark(ray.is_some_and(|r| r.shared_storage.is_some()), "sharedStorage");
        mark(ray.is_some_and(|r| r.debug.is_some()), "ray debug");
        mark(ray.is_some_and(|r| r.autoscaling.is_some()), "autoscaling");
    }
    #[rustfmt::skip]
    let want = [
        "PyTorchJob", "RayJob", "description", "labels", "hidden env", "volumes", "datasets", "models",
        "external image", "Reserved", "Ondemand", "Spot", "Idle", "guarantee", "idleSupplement",
        "several instance specs", "precheck", "faultTolerance", "exitCheckpoint", "metrics", "queuedTooLong",
        "procsPerNode", "ray head", "runtimeEnv", "sharedStorage", "ray debug", "autoscaling",
    ];
    let missing: Vec<&str> = want.iter().copied().filter(|w| !seen.contains(w)).collect();
    assert!(missing.is_empty(), "the generator never produced: {missing:?}");
}

// ---------------------------------------------------------------------------------------------------------
// (b) No input makes `check` panic, hang or come back empty-handed
// ---------------------------------------------------------------------------------------------------------

/// `check` either decodes a task or says why not; a task with no problem at all reads back unchanged.
fn checks_sanely(input: &[u8]) -> Result<Checked, TestCaseError> {
    let checked = check(input, cat());
    prop_assert!(
        checked.task.is_some() || !checked.report.problems.is_empty(),
        "no task and no problem for {:?}",
        String::from_utf8_lossy(input)
    );
    if let Some(task) = &checked.task {
        let yaml = task.to_yaml();
        // Whatever was decoded (defaults standing in for what failed) is a well-formed task: its YAML
        // reads back unchanged, with no decoding problem.
        let (back, d) = parse(yaml.as_bytes());
        prop_assert!(
            d.report.problems.is_empty(),
            "the YAML of a decoded task does not parse clean:\n{}--- YAML:\n{yaml}",
            render(&d.report.problems)
        );
        let back = back.expect("a task when there are no problems");
        prop_assert!(
            back == *task,
            "a decoded task does not round-trip:\n{}--- YAML:\n{yaml}",
            diff(task, &back)
        );
    }
    Ok(checked)
}

/// Pieces of YAML and JSON syntax, and words of the schema, to assemble structured noise from.
#[rustfmt::skip]
const TOKENS: &[&str] = &[
    "apiVersion", "kind", "metadata", "spec", "environment", "compute", "advanced", "ray", "pytorch", "env",
    "volumes", "instanceSpecs", "labels", "runtimeEnvYaml", "TrainingTask", "trainyard.dev/v1", "RayJob",
    "PyTorchJob", ": ", ":", "\n", "  ", "    ", "- ", "-", "{", "}", "[", "]", ",", "\"", "'", "&a ", "*a",
    "&b ", "*b", "<<: ", "!!str ", "!!int ", "!!binary ", "!custom ", "? ", "|\n", "|-\n", ">\n", "#",
    "---\n", "...\n", "%YAML 1.2\n", "%TAG ! tag:x:\n", "~", "null", "true", "0", "-1", "1e999",
    "99999999999999999999", "-9223372036854775809", "1.5", ".nan", "\t", "\r\n", "\u{FEFF}", "\\u0000", "\\",
    "é", "\u{0}", " ",
];

fn yaml_soup() -> impl Strategy<Value = String> {
    vec(select(TOKENS), 0..300).prop_map(|v| v.concat())
}

/// One edit of a document.
#[derive(Debug, Clone)]
enum Mutation {
    FlipByte(Index, u8),
    Truncate(Index),
    Insert(Index, Vec<u8>),
    DeleteLine(Index),
    DuplicateLine(Index),
    DeleteRange(Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let insert = prop_oneof![
        vec(any::<u8>(), 1..8),
        select(TOKENS).prop_map(|t| t.as_bytes().to_vec()),
        Just(vec![0xff]),
        Just(vec![0xe2, 0x80]),
    ];
    prop_oneof![
        3 => (any::<Index>(), 1u8..).prop_map(|(i, x)| Mutation::FlipByte(i, x)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        3 => (any::<Index>(), insert).prop_map(|(i, b)| Mutation::Insert(i, b)),
        2 => any::<Index>().prop_map(Mutation::DeleteLine),
        1 => any::<Index>().prop_map(Mutation::DuplicateLine),
        1 => (any::<Index>(), 1usize..64).prop_map(|(i, n)| Mutation::DeleteRange(i, n)),
    ]
}

fn apply(doc: &mut Vec<u8>, m: &Mutation) {
    let line_bounds = |doc: &[u8]| -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut start = 0;
        for (i, b) in doc.iter().enumerate() {
            if *b == b'\n' {
                out.push((start, i + 1));
                start = i + 1;
            }
        }
        if start < doc.len() {
            out.push((start, doc.len()));
        }
        out
    };
    match m {
        Mutation::FlipByte(i, x) if !doc.is_empty() => {
            let i = i.index(doc.len());
            doc[i] ^= x;
        }
        Mutation::Truncate(i) => {
            let i = i.index(doc.len() + 1);
            doc.truncate(i);
        }
        Mutation::Insert(i, bytes) => {
            let i = i.index(doc.len() + 1);
            doc.splice(i..i, bytes.iter().copied());
        }
        Mutation::DeleteLine(i) | Mutation::DuplicateLine(i) => {
            let lines = line_bounds(doc);
            if lines.is_empty() {
                return;
            }
            let (s, e) = *i.get(&lines);
            if matches!(m, Mutation::DeleteLine(_)) {
                doc.drain(s..e);
            } else {
                let line = doc[s..e].to_vec();
                doc.splice(e..e, line);
            }
        }
        Mutation::DeleteRange(i, n) if !doc.is_empty() => {
            let s = i.index(doc.len());
            let e = (s + n).min(doc.len());
            doc.drain(s..e);
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn check_survives_arbitrary_bytes(bytes in vec(any::<u8>(), 0..4096)) {
        checks_sanely(&bytes)?;
    }

    #[test]
    fn check_survives_arbitrary_strings(
        text in prop_oneof![
            any::<String>(),
            vec(text_char(), 0..2048).prop_map(String::from_iter),
            yaml_soup(),
            yaml_soup().prop_map(|s| format!("{{{s}")),
        ]
    ) {
        checks_sanely(text.as_bytes())?;
    }

    #[test]
    fn check_survives_mutated_examples(
        which in any::<Index>(),
        edits in vec(mutation(), 1..8),
    ) {
        let (_, original) = which.get(&EXAMPLES);
        let mut doc = original.clone();
        for m in &edits {
            apply(&mut doc, m);
        }
        checks_sanely(&doc)?;
    }
}

/// Runs `check` and asserts that it came back within seconds (not minutes or never) with a problem.
fn check_quickly(what: &str, input: &[u8]) -> Checked {
    let start = Instant::now();
    let checked = check(input, cat());
    let took = start.elapsed();
    assert!(took < Duration::from_secs(10), "{what}: check took {took:?}");
    assert!(!checked.report.problems.is_empty(), "{what}: no problem reported");
    checked
}

fn codes(c: &Checked) -> Vec<Code> {
    c.report.problems.iter().map(|p| p.code).collect()
}

#[test]
fn documents_over_the_size_limit_are_refused() {
    for n in [MAX_DOCUMENT_BYTES + 1, 2 * MAX_DOCUMENT_BYTES] {
        // Valid YAML (a comment) that would otherwise be read.
        let mut doc = example("pytorch-single.yaml").into_bytes();
        doc.resize(n - 1, b'#');
        doc.push(b'\n');
        let checked = check_quickly("oversized document", &doc);
        assert!(checked.task.is_none());
        assert_eq!(codes(&checked), [Code::TooLarge], "{:?}", checked.report.problems);
    }
    // Exactly at the limit is read.
    let mut doc = example("pytorch-single.yaml").into_bytes();
    doc.extend_from_slice(b"\n#");
    doc.resize(MAX_DOCUMENT_BYTES - 1, b'#');
    doc.push(b'\n');
    assert_eq!(doc.len(), MAX_DOCUMENT_BYTES);
    let checked = check(&doc, cat());
    assert!(checked.report.problems.is_empty(), "{:?}", checked.report.problems);
    assert!(checked.task.is_some());
}

/// Ten levels of nine aliases each: 9^9 (387 million) "lol"s when expanded.
fn billion_laughs(top_key: &str) -> String {
    let mut s = format!("{top_key}0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for i in 1..10 {
        let refs = vec![format!("*a{}", i - 1); 9].join(", ");
        s.push_str(&format!("{top_key}{i}: &a{i} [{refs}]\n"));
    }
    s
}

#[test]
fn alias_bombs_are_refused_quickly() {
    // As the whole document.
    let checked = check_quickly("billion laughs", billion_laughs("lol").as_bytes());
    assert!(codes(&checked).contains(&Code::Syntax), "{:?}", checked.report.problems);

    // Inside a field of an otherwise valid task.
    let mut doc = example("pytorch-single.yaml");
    doc = doc.replace("metadata:\n", &format!("{}metadata:\n", billion_laughs("x-")));
    doc.push_str("  advanced:\n    alarms: *a9\n");
    let checked = check_quickly("billion laughs inside a task", doc.as_bytes());
    assert!(codes(&checked).contains(&Code::Syntax), "{:?}", checked.report.problems);

    // Block mappings that alias each other, and merge keys.
    let mut merge = String::from("m0: &m0 {a: 1, b: 2, c: 3, d: 4, e: 5, f: 6, g: 7, h: 8}\n");
    for i in 1..12 {
        let p = i - 1;
        merge.push_str(&format!("m{i}: &m{i} {{a: *m{p}, b: *m{p}, c: *m{p}, d: *m{p}, <<: *m{p}}}\n"));
    }
    let checked = check_quickly("merge-key bomb", merge.as_bytes());
    assert!(codes(&checked).contains(&Code::Syntax), "{:?}", checked.report.problems);

    // As a Ray runtime env, which is YAML text inside the task and parsed again.
    let mut task = parse(example("ray-local.yaml").as_bytes()).0.unwrap();
    task.spec.ray =
        Some(RaySettings { runtime_env_yaml: Some(billion_laughs("k")), ..RaySettings::default() });
    let checked = check_quickly("billion laughs as a runtime env", task.to_yaml().as_bytes());
    assert!(
        checked.report.problems.iter().any(|p| p.path == "spec.ray.runtimeEnvYaml" && p.code == Code::Syntax),
        "{:?}",
        checked.report.problems
    );
}

#[test]
fn deeply_nested_documents_are_refused_quickly() {
    let deep_block: String = (0..400).map(|i| format!("{}a:\n", "  ".repeat(i))).collect();
    let inputs: Vec<(&str, String)> = vec![
        ("10,000 [", "[".repeat(10_000)),
        ("100,000 [", "[".repeat(100_000)),
        ("10,000 [ then ]", format!("{}{}", "[".repeat(10_000), "]".repeat(10_000))),
        ("10,000 {", "{".repeat(10_000)),
        ("10,000 { after a key", format!("a: {}", "{".repeat(10_000))),
        ("10,000 JSON objects", format!("{}1{}", "{\"a\":".repeat(10_000), "}".repeat(10_000))),
        ("10,000 JSON arrays", format!("{{\"a\":{}{}}}", "[".repeat(10_000), "]".repeat(10_000))),
        ("10,000 block sequences", format!("{}x\n", "- ".repeat(10_000))),
        ("400 block mappings", deep_block),
        ("10,000 [ in a field", format!("apiVersion: {}\n", "[".repeat(10_000))),
    ];
    for (what, text) in &inputs {
        let checked = check_quickly(what, text.as_bytes());
        assert!(checked.task.is_none(), "{what}");
        assert_eq!(codes(&checked), [Code::Syntax], "{what}: {:?}", checked.report.problems);
    }

    // Inside the Ray runtime env text.
    let mut task = parse(example("ray-local.yaml").as_bytes()).0.unwrap();
    task.spec.ray =
        Some(RaySettings { runtime_env_yaml: Some("[".repeat(10_000)), ..RaySettings::default() });
    let checked = check_quickly("10,000 [ as a runtime env", task.to_yaml().as_bytes());
    assert!(
        checked.report.problems.iter().any(|p| p.path == "spec.ray.runtimeEnvYaml" && p.code == Code::Syntax),
        "{:?}",
        checked.report.problems
    );
}
