//! The Kubernetes backend: one PyTorchJob (Kubeflow training operator) or RayJob (KubeRay) per attempt.
//!
//! - `objects`: an attempt's objects, pure (the job, its Secrets, the precheck's Service, a PodGroup).
//! - `views`: API objects read into what the verdict needs; the labels and annotations tying them to attempts.
//! - `status`: the verdict on a job and its pods, pure, with the local backend's failure classes.
//! - `state`: what the watches have seen and what of it was reported.
//! - `inventory`: the cluster's nodes merged into the catalog, pure.
//! - `capture`: the pods' logs and metrics, followed and scraped through the API server onto the server's disk.
//! - `backend`: the client side: applies, deletions, the `Backend` calls; its `watches` keep the state.
//! - `fleet`: one backend per kubeconfig context, for catalogs with several clusters.

mod backend;
pub mod capture;
pub mod fleet;
pub mod inventory;
mod names;
pub mod objects;
mod pods;
mod state;
pub mod status;
pub mod views;

/// The client library and the API types, for callers that talk to the cluster themselves (tests, tools).
pub use ::k8s_openapi as openapi;
pub use ::kube as client;
pub use backend::{FIELD_MANAGER, KubeBackend, KubeConfig};
pub use fleet::KubeFleet;
