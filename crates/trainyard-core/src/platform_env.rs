//! The variables the platform sets in every replica: one list, so the validator reserves exactly what the
//! backends set. A task may not set a reserved name (its value would be overwritten, or would mislead
//! torchrun or Ray); the defaults are set first and a task may override them.

/// The distributed training contract (torchrun reads its `PET_*` options from the environment).
pub const MASTER_ADDR: &str = "MASTER_ADDR";
pub const MASTER_PORT: &str = "MASTER_PORT";
pub const WORLD_SIZE: &str = "WORLD_SIZE";
pub const RANK: &str = "RANK";
pub const PET_MASTER_ADDR: &str = "PET_MASTER_ADDR";
pub const PET_MASTER_PORT: &str = "PET_MASTER_PORT";
pub const PET_NNODES: &str = "PET_NNODES";
pub const PET_NODE_RANK: &str = "PET_NODE_RANK";
pub const PET_NPROC_PER_NODE: &str = "PET_NPROC_PER_NODE";

/// The task's context.
pub const TASK_UUID: &str = "TASK_UUID";
pub const X_USER_NAME: &str = "X_USER_NAME";
pub const X_ORG_NAME: &str = "X_ORG_NAME";
pub const X_TENANT_ID: &str = "X_TENANT_ID";
pub const X_REGION: &str = "X_REGION";
pub const X_CLUSTER: &str = "X_CLUSTER";

/// The replica's own.
pub const HOSTNAME: &str = "HOSTNAME";
pub const CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";

/// RayJobs: the cluster's address, and the driver's job config (its runtime env).
pub const RAY_ADDRESS: &str = "RAY_ADDRESS";
pub const RAY_JOB_CONFIG_JSON_ENV_VAR: &str = "RAY_JOB_CONFIG_JSON_ENV_VAR";

/// Every name the platform sets and a task may not.
pub const RESERVED: &[&str] = &[
    MASTER_ADDR,
    MASTER_PORT,
    WORLD_SIZE,
    RANK,
    PET_MASTER_ADDR,
    PET_MASTER_PORT,
    PET_NNODES,
    PET_NODE_RANK,
    PET_NPROC_PER_NODE,
    TASK_UUID,
    X_USER_NAME,
    X_ORG_NAME,
    X_TENANT_ID,
    X_REGION,
    X_CLUSTER,
    HOSTNAME,
    CUDA_VISIBLE_DEVICES,
    RAY_ADDRESS,
    RAY_JOB_CONFIG_JSON_ENV_VAR,
];

/// Every name that starts with this is the platform's (`TRAINYARD_RUNTIME_DIR`, `TRAINYARD_REPLICA`, ...).
pub const RESERVED_PREFIX: &str = "TRAINYARD_";

/// Whether a task may not set `name`.
pub fn is_reserved(name: &str) -> bool {
    RESERVED.contains(&name) || name.starts_with(RESERVED_PREFIX)
}

/// Set before the task's own variables, which may override them.
pub const DEFAULTS: &[(&str, &str)] =
    &[("HOME", "/root"), ("LANG", "C.UTF-8"), ("RAY_USAGE_STATS_ENABLED", "0")];
