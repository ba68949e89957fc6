//! Schemas of the other crates' types the API answers with as they serialise: the task document (from its
//! decoder), problems, demand, quota lines, alarm subscriptions and the catalog. The OpenAPI test checks
//! them against real answers, so a field added to one of these types shows up as a failure there.

use crate::schema::{ApiSchema, Optional, Schemas, named, object_schema};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use trainyard_control::QuotaLine;
use trainyard_core::catalog::{
    Catalog, Cluster, DataAsset, Image, InstanceKind, InstanceSpec, LabelPolicy, Node, Pool, ProjectGroup,
    QuotaEntry, Region, Registry, Toleration, Volume,
};
use trainyard_core::decode::Decode;
use trainyard_core::demand::{Demand, QuotaDemand, Resources, Role, RoleDemand};
use trainyard_core::lifecycle::Status;
use trainyard_core::spec::{AlarmEvent, AlarmSubscription, ResourceType, TaskType, TrainingTask};
use trainyard_core::{Code, Problem, Severity};

/// Types whose schema is their decoder's ([`Decode::schema`]): the document forms the validator reads.
/// Named ones are defined once in the document's components.
macro_rules! decoder_schema {
    ($($ty:ty $(as $name:literal)?),* $(,)?) => {
        $(impl ApiSchema for $ty {
            fn schema(_schemas: &mut Schemas) -> Value {
                $( return named(_schemas, $name, |_| <$ty as Decode>::schema()); )?
                #[allow(unreachable_code)]
                <$ty as Decode>::schema()
            }
        })*
    };
}

decoder_schema! {
    TrainingTask as "TrainingTask",
    AlarmSubscription as "AlarmSubscription",
    TaskType,
    Status,
    ResourceType,
    InstanceKind,
    AlarmEvent,
}

impl ApiSchema for Code {
    fn schema(_: &mut Schemas) -> Value {
        let codes: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
        json!({"type": "string", "enum": codes})
    }
}

impl ApiSchema for Severity {
    fn schema(_: &mut Schemas) -> Value {
        json!({"type": "string", "enum": ["error", "warning"]})
    }
}

impl ApiSchema for Role {
    fn schema(_: &mut Schemas) -> Value {
        json!({"type": "string", "enum": [Role::Master.as_str(), Role::Worker.as_str(), Role::Head.as_str()]})
    }
}

object_schema!(
    /// One problem at one field: its path from the document root, a stable code, a severity and what to
    /// change.
    closed Problem as "DocumentProblem" { "path": String, "code": Code, "severity": Severity, "message": String }
);

object_schema!(
    /// GPUs, vCPUs and memory.
    closed Resources as "Resources" { "gpus": u64, "vcpus": u64, "memoryMib": u64 }
);

object_schema!(
    /// What a task needs when one of its instance-spec options is chosen.
    closed Demand as "Demand" {
        "option": usize,
        "roles": Vec<RoleDemand>,
        "replicas": u32,
        "quota": Vec<QuotaDemand>,
        "total": Resources,
    }
);

object_schema!(
    /// The demand of one role (master, workers or head).
    closed RoleDemand as "RoleDemand" {
        "role": Role,
        "replicas": u32,
        "spec": String,
        "countPerNode": u32,
        "perReplica": Resources,
        "units": u64,
        "total": Resources,
    }
);

object_schema!(
    /// Spec units counted against quota for one instance spec.
    closed QuotaDemand as "QuotaDemand" { "spec": String, "units": u64 }
);

object_schema!(
    /// One quota of a project group, in spec units, with the capacity figures of its pool and spec.
    closed QuotaLine as "QuotaLine" {
        "group": String,
        "resourceType": ResourceType,
        "pool": String,
        "spec": String,
        "limit": u64,
        "remaining": u64,
        "poolAvailable": u64,
        "idle": u64,
        "unreserved": u64,
    }
);

object_schema!(
    /// The catalog: regions, clusters, pools, instance specs, nodes, project groups, images, storage,
    /// label policy and quotas.
    closed Catalog as "Catalog" {
        "regions": BTreeMap<String, Region>,
        "clusters": BTreeMap<String, Cluster>,
        "pools": BTreeMap<String, Pool>,
        "instanceSpecs": BTreeMap<String, InstanceSpec>,
        "nodes": BTreeMap<String, Node>,
        "projectGroups": BTreeMap<String, ProjectGroup>,
        "images": BTreeMap<String, Image>,
        "allowExternalImages": bool,
        "registries": Optional<BTreeMap<String, Registry>>,
        "volumes": BTreeMap<String, Volume>,
        "datasets": BTreeMap<String, DataAsset>,
        "models": BTreeMap<String, DataAsset>,
        "labels": LabelPolicy,
        "quotas": Vec<QuotaEntry>,
    }
);

object_schema!(closed Region as "Region" { "displayName": Optional<String> });
object_schema!(closed Cluster as "Cluster" { "region": String, "context": Optional<String> });
object_schema!(
    /// A registry external image references may come from, and how it is reached.
    closed Registry as "Registry" {
        "mirrors": Optional<Vec<String>>,
        "insecure": Optional<bool>,
        "caBundle": Optional<String>,
    }
);
object_schema!(
    /// A pool of one cluster: its instance specs, and on Kubernetes the tolerations and node selector its pods
    /// get.
    closed Pool as "Pool" {
        "cluster": String,
        "instanceSpecs": Vec<String>,
        "tolerations": Optional<Vec<Toleration>>,
        "nodeSelector": Optional<BTreeMap<String, String>>,
    }
);
object_schema!(
    /// A Kubernetes toleration (operator Equal or Exists; effect NoSchedule, PreferNoSchedule or NoExecute).
    closed Toleration as "Toleration" {
        "key": Optional<String>,
        "operator": Optional<String>,
        "value": Optional<String>,
        "effect": Optional<String>,
    }
);
object_schema!(closed ProjectGroup as "ProjectGroup" { "displayName": Optional<String> });

object_schema!(
    /// A slice shape: GPUs of one model, vCPUs, memory; on Kubernetes, the GPUs' resource name, other
    /// extended resources per unit, and the node selector and tolerations its pods add to their pool's.
    closed InstanceSpec as "InstanceSpec" {
        "kind": InstanceKind,
        "gpuModel": Optional<String>,
        "gpus": u32,
        "vcpus": u32,
        "memoryMib": u64,
        "gpuResource": Optional<String>,
        "extraResources": Optional<BTreeMap<String, u64>>,
        "nodeSelector": Optional<BTreeMap<String, String>>,
        "tolerations": Optional<Vec<Toleration>>,
    }
);

object_schema!(
    /// A node's capacity and state (`failed` only when it is).
    closed Node as "Node" {
        "pool": String,
        "schedulable": bool,
        "failed": Optional<bool>,
        "gpuModel": Optional<String>,
        "gpus": u32,
        "gpuDevices": Optional<Vec<u32>>,
        "vcpus": u32,
        "memoryMib": u64,
    }
);

object_schema!(
    /// An image and where, and to whom, it is offered.
    closed Image as "Image" {
        "clusters": Vec<String>,
        "ray": bool,
        "torch": bool,
        "rayVersion": Optional<String>,
        "rootfs": Optional<String>,
        "reference": Optional<String>,
        "runAsUser": Optional<u32>,
        "runAsGroup": Optional<u32>,
        "projectGroups": Optional<Vec<String>>,
    }
);

object_schema!(
    /// A storage volume.
    closed Volume as "Volume" {
        "clusters": Vec<String>,
        "multiPodReadWrite": bool,
        "path": Optional<String>,
        "projectGroups": Optional<Vec<String>>,
    }
);

object_schema!(
    /// A dataset or a model.
    closed DataAsset as "DataAsset" {
        "clusters": Vec<String>,
        "path": Optional<String>,
        "projectGroups": Optional<Vec<String>>,
    }
);

object_schema!(
    /// The maintained labels, and whether tasks must use them.
    closed LabelPolicy as "LabelPolicy" { "validation": bool, "maintained": BTreeMap<String, Vec<String>> }
);

object_schema!(
    /// A project group's quota for one resource type, pool and instance spec.
    closed QuotaEntry as "QuotaEntry" {
        "group": String, "resourceType": ResourceType, "pool": String, "spec": String, "units": u64,
    }
);

/// The types of other crates cannot be declared with their schema (`view!`), so these check real values
/// against their lists: what is sent is listed, and what is listed as required is sent.
#[cfg(test)]
mod tests {
    use super::*;

    /// Checks every object in `value` against its schema in `schema`, through references, lists, maps and
    /// nullable fields: its keys are among the properties, and the required ones are all there.
    fn keys_follow(value: &Value, schema: &Value, schemas: &Schemas, at: &str) {
        if let Some(name) = schema["$ref"].as_str().and_then(|r| r.strip_prefix("#/components/schemas/")) {
            return keys_follow(value, &schemas[name], schemas, &format!("{at} ({name})"));
        }
        if let Some(any) = schema["anyOf"].as_array() {
            for s in any.iter().filter(|_| !value.is_null()).filter(|s| s["type"] != "null") {
                keys_follow(value, s, schemas, at);
            }
            return;
        }
        match value {
            Value::Object(fields) => {
                match (schema["properties"].as_object(), &schema["additionalProperties"]) {
                    (Some(properties), _) => {
                        for (key, v) in fields {
                            let property = properties.get(key);
                            assert!(
                                property.is_some(),
                                "{at}: {key} is sent but its schema does not list it"
                            );
                            keys_follow(v, property.unwrap_or(&Value::Null), schemas, &format!("{at}.{key}"));
                        }
                        for key in
                            schema["required"].as_array().into_iter().flatten().filter_map(Value::as_str)
                        {
                            assert!(fields.contains_key(key), "{at}: {key} is required but not sent");
                        }
                    }
                    (None, each @ Value::Object(_)) => {
                        for (key, v) in fields {
                            keys_follow(v, each, schemas, &format!("{at}.{key}"));
                        }
                    }
                    _ => {}
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    keys_follow(v, &schema["items"], schemas, &format!("{at}[{i}]"));
                }
            }
            _ => {}
        }
    }

    fn check<T: ApiSchema + serde::Serialize>(sample: &T) {
        let mut schemas = Schemas::new();
        let schema = T::schema(&mut schemas);
        let value = serde_json::to_value(sample).unwrap();
        assert!(value.is_object() || value.is_array(), "{value}");
        keys_follow(&value, &schema, &schemas, std::any::type_name::<T>());
    }

    #[test]
    fn other_crates_answers_send_what_their_schemas_list() {
        let catalog = Catalog::from_yaml(include_str!("../../../examples/catalog/catalog.yaml")).unwrap();
        check(&catalog);
        let task = include_bytes!("../../../examples/pytorch-ddp.yaml");
        let checked = trainyard_core::check(task, &catalog);
        let valid = checked.valid_task().unwrap();
        let lookup = |name: &str| catalog.instance_specs.get(name);
        check(&trainyard_core::demand_options(&valid.spec, &lookup).unwrap());
        let bad = trainyard_core::check(b"kind: TrainingTask\nspec: 3\n", &catalog);
        assert!(!bad.report.problems.is_empty());
        check(&bad.report.problems);
        let line = |group: &str| QuotaLine {
            group: group.into(),
            resource_type: "Reserved".into(),
            pool: "default".into(),
            spec: "cpu.small".into(),
            limit: 8,
            remaining: 2,
            pool_available: 4,
            idle: 1,
            unreserved: 0,
        };
        check(&vec![line("nlp"), line("cv")]);
        check(&vec![trainyard_images::Cached {
            digest: "sha256:00".into(),
            references: vec!["docker.io/library/python:3".into()],
            bytes: 1,
            last_used_ms: 2,
            pulled_ms: 3,
        }]);
        check(&trainyard_images::Collected { removed: vec!["sha256:00".into()], freed_bytes: 1, bytes: 2 });
    }
}
