//! Limits. Named so the docs, the console and the tests use the same figures.

/// The final name is `prefix-xxxxx` and must fit a DNS-1123 label (63 characters).
pub const NAME_SUFFIX_LEN: usize = 6;
pub const DNS_LABEL_MAX: usize = 63;
pub const NAME_PREFIX_MAX: usize = DNS_LABEL_MAX - NAME_SUFFIX_LEN;
pub const LABELS_MAX: usize = 64;
pub const LABEL_NAME_MAX: usize = 63;
pub const LABEL_PREFIX_MAX: usize = 253;
pub const DESCRIPTION_MAX: usize = 2048;
pub const ENV_VARS_MAX: usize = 512;
/// Linux refuses a single environment string longer than this (MAX_ARG_STRLEN).
pub const ENV_VALUE_MAX_BYTES: usize = 128 * 1024 - 1;
pub const MOUNTS_MAX: usize = 64;
pub const MOUNT_PATH_MAX: usize = 1024;
pub const CMD_MAX_BYTES: usize = 64 * 1024;
pub const WORKERS_MAX: u32 = 4095;
pub const INSTANCE_SPECS_MAX: usize = 8;
pub const COUNT_PER_NODE_MAX: u32 = 64;
pub const PRIORITY_MIN: u32 = 1;
pub const PRIORITY_MAX: u32 = 10;
pub const PRECHECK_TIMEOUT_MAX_S: u32 = 3600;
pub const MAX_RESUBMISSIONS_MAX: u32 = 100;
/// The reference page caps the exit checkpoint wait at 600 seconds.
pub const EXIT_CHECKPOINT_TIMEOUT_MAX_S: u32 = 600;
pub const METRICS_ENDPOINTS_MAX: usize = 16;
pub const METRICS_PATH_MAX: usize = 256;
pub const METRICS_INTERVAL_MIN_S: u32 = 5;
pub const METRICS_INTERVAL_MAX_S: u32 = 3600;
pub const IMAGE_PULL_TOLERANCE_MAX: i64 = 100;
pub const ALARMS_MAX: usize = 16;
pub const ALARM_QUEUED_THRESHOLD_MIN_S: u32 = 60;
pub const URL_MAX: usize = 2048;
pub const PROCS_PER_NODE_MAX: u32 = 256;
pub const RAY_RETENTION_MAX_S: u32 = 86_400;
pub const RAY_IDLE_TIMEOUT_MAX_S: u32 = 86_400;
pub const IMAGE_REF_MAX: usize = 512;
