//! The HTTP API: JSON over HTTP, bearer tokens, visibility decided by the store, errors as RFC 9457 problem
//! details (mapped from typed errors in one place, [`ApiError`]), and the control loop ticking in the
//! background.
//!
//! Routes (all under `/api/v1` but `/healthz`, `/metrics`, `/api/openapi.json`, `/api/docs` and the console's
//! `/` and `/console/*`; the OpenAPI document describes each of the others with its answers and errors, from
//! [`openapi::OPERATIONS`]):
//! - `GET /whoami`
//! - tasks: `POST /tasks` (YAML or JSON body; `Idempotency-Key` header; within the owner's cap on queued
//!   tasks), `GET /tasks` (filters, cursor paging), `DELETE /tasks` (by filter), `POST /validate`,
//!   `GET`/`DELETE /tasks/{id}`, `POST /tasks/{id}/stop`, `.../resubmit`, `.../clone`, `.../shares`
//! - what a task tells: `GET /tasks/{id}/events`, `.../logs` (replicas; a log as text or a stream),
//!   `.../metrics`
//! - the cluster: `GET /catalog`, `GET /quota`; admin: `PUT /admin/catalog` (refused when it takes away what
//!   active tasks use: `catalog_guard`), `PUT /admin/nodes/{node}`, `GET`/`PUT /admin/settings`
//! - users: admin: `GET`/`POST /admin/users`, `POST /admin/users/{name}/disable` and `.../enable`; the user
//!   or an admin: `GET`/`POST /users/{name}/tokens`, `DELETE /users/{name}/tokens/{token}`,
//!   `GET`/`PUT /users/{name}/env`, `DELETE /users/{name}/env/{var}`, `GET`/`PUT /users/{name}/alarms`
//!
//! A task the caller may not see answers 404, exactly like one that does not exist, so names do not leak.
//! Every query refuses a parameter its operation does not take (400).
//!
//! Where things are: [`router`] maps routes to the handlers in `routes/` (one file per family); every
//! submission goes through `submit`; who may do what is `auth`; answers are the types in [`views`], whose
//! schemas ([`schema`]) the OpenAPI document is built from; [`serve_with`] runs it all with the loops of
//! `background`.

#![forbid(unsafe_code)]

pub mod archive;
mod auth;
pub mod backends;
mod background;
pub mod catalog_guard;
pub mod console;
mod error;
mod foreign_schemas;
pub mod leader;
mod metrics;
pub mod openapi;
mod operations;
mod router;
mod routes;
pub mod schema;
mod serve;
pub mod settings;
mod state;
mod submit;
mod tokens;
pub mod views;

pub use background::{
    ALARM_INTERVAL, SETTLING_INTERVAL, TICK_INTERVAL, TICK_REST, spawn_alarm_delivery, spawn_control_loop,
    webhook_key,
};
pub use error::{ApiError, MAX_URI_BYTES, ProblemBody};
pub use metrics::Metrics;
pub use router::router;
pub use routes::admin::CATALOG_SETTING;
pub use routes::users::{TOKEN_LABEL_MAX_BYTES, USER_NAME_MAX_BYTES};
pub use serve::{
    HEADER_READ_TIMEOUT, HttpLimits, IDLE_TIMEOUT, MAX_CONNECTIONS, ServeOptions, serve, serve_with,
};
pub use state::{AppState, now_ms};
pub use submit::IDEMPOTENCY_KEY_MAX_BYTES;
pub use tokens::{TOKEN_CACHE_TTL, TokenCache, new_token, token_hash};
pub use views::{QueueView, TaskView};
