//! Kueue's objects as the Kubernetes tests set them up: a ResourceFlavor, a ClusterQueue over it for every
//! namespace, and a LocalQueue pointing at it.

use serde_json::{Value, json};
use trainyard_kube::client::api::{ApiResource, GroupVersionKind};

/// The API resource of a Kueue kind (`kueue.x-k8s.io/v1beta1`).
pub fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("kueue.x-k8s.io", "v1beta1", kind), plural)
}

pub fn flavor(name: &str) -> Value {
    json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor", "metadata": {"name": name}})
}

/// A ClusterQueue `name` over the flavor `flavor`: `cpu` CPUs and 64 GiB, for every namespace.
pub fn cluster_queue(name: &str, flavor: &str, cpu: &str) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{
            "coveredResources": ["cpu", "memory"],
            "flavors": [{"name": flavor, "resources": [
                {"name": "cpu", "nominalQuota": cpu}, {"name": "memory", "nominalQuota": "64Gi"}]}],
        }]},
    })
}

/// A LocalQueue `name` in `namespace`, admitting through `cluster_queue`.
pub fn local_queue(name: &str, namespace: &str, cluster_queue: &str) -> Value {
    json!({"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "LocalQueue",
           "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue}})
}
