//! The Kubernetes backend: each admitted attempt becomes one PyTorchJob or RayJob object (and its Secrets).
pub mod objects;
