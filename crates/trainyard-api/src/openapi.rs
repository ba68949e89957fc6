//! The OpenAPI 3.1 document, built from the operation table below and the task's JSON Schema (itself
//! generated from the spec decoder), served at `/api/openapi.json`, and a page that renders it with no
//! network access at `/api/docs`.

use serde_json::{Value, json};
use trainyard_core::decode::Decode;
use trainyard_core::spec::TrainingTask;

/// One operation: method, path, summary, whether it takes the task document, and its success status.
#[derive(Debug)]
pub struct Operation {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    pub body: Body,
    pub ok: u16,
}

#[derive(Debug)]
pub enum Body {
    None,
    Task,
    Json(&'static str),
}

/// Every operation the router serves (a test checks the router against this table).
pub const OPERATIONS: &[Operation] = &[
    Operation {
        method: "get",
        path: "/api/v1/whoami",
        summary: "The caller: name, role, groups",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "get",
        path: "/api/v1/catalog",
        summary: "The catalog tasks are checked against",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks",
        summary: "Submit a task (YAML or JSON). Send Idempotency-Key to make retries safe: the same key and body return the first task (200), another body is a 409",
        body: Body::Task,
        ok: 201,
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks",
        summary: "Tasks visible to the caller (newest first unless sort says otherwise). Query: status, type, group, owner, q (name or id), labels (k=v,...), sort (newest, oldest, name, updated), cursor, limit (≤ 500)",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks/{id}",
        summary: "One task: spec (hidden values masked), placement, queue position and reason",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "delete",
        path: "/api/v1/tasks/{id}",
        summary: "Stop (with the checkpoint window) and delete; the history is kept",
        body: Body::None,
        ok: 204,
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks/{id}/events",
        summary: "Every event of the task, in order (query: after=SEQ)",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks/{id}/logs",
        summary: "Without replica: the replicas of each attempt. With replica=NAME (attempt=N, offset=B): its log as text (X-Next-Offset); follow=true streams server-sent events until it ends",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "get",
        path: "/api/v1/tasks/{id}/metrics",
        summary: "Preset (trainyard_*) and scraped metrics per replica as series of [atMs, value] (query: attempt, since, name)",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "post",
        path: "/api/v1/validate",
        summary: "Check a task document without creating it: every problem, and the demand of each instance-spec option",
        body: Body::Task,
        ok: 200,
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks/{id}/stop",
        summary: "Stop: a queued task at once, a running one through Stopping",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks/{id}/resubmit",
        summary: "Run an ended task again as a new attempt",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks/{id}/clone",
        summary: "A new task from this one's spec, owned by the caller, in one of the caller's project groups (admins: any). Hidden values are never copied: give each in hiddenValues, or the answer is a 422 (masked-value) naming the variable",
        body: Body::Json(
            r#"{"type": "object", "properties": {"projectGroup": {"type": "string"}, "hiddenValues": {"type": "object", "additionalProperties": {"type": "string"}}}}"#,
        ),
        ok: 201,
    },
    Operation {
        method: "post",
        path: "/api/v1/tasks/{id}/shares",
        summary: "Share with a user: view, or view and operate (owner or admin)",
        body: Body::Json(
            r#"{"type": "object", "required": ["user"], "properties": {"user": {"type": "string"}, "operate": {"type": "boolean", "default": false}}}"#,
        ),
        ok: 204,
    },
    Operation {
        method: "get",
        path: "/api/v1/quota",
        summary: "Quota and usage per project group, resource type, pool and instance spec (members see their groups)",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "put",
        path: "/api/v1/admin/catalog",
        summary: "Replace the catalog (YAML or JSON; admin)",
        body: Body::Json(r#"{"type": "object"}"#),
        ok: 200,
    },
    Operation {
        method: "put",
        path: "/api/v1/admin/nodes/{name}",
        summary: "Cordon or uncordon a node (schedulable), or mark it failed: its replicas are killed and fault tolerance takes over (admin)",
        body: Body::Json(
            r#"{"type": "object", "properties": {"schedulable": {"type": "boolean"}, "failed": {"type": "boolean"}}}"#,
        ),
        ok: 204,
    },
    Operation {
        method: "get",
        path: "/api/v1/admin/users",
        summary: "Every user: name, role and project groups, by name (admin; never tokens)",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "post",
        path: "/api/v1/admin/users",
        summary: "Create or update a user (admin)",
        body: Body::Json(
            r#"{"type": "object", "required": ["name", "role"], "properties": {"name": {"type": "string"}, "role": {"enum": ["admin", "member"]}, "groups": {"type": "array", "items": {"type": "string"}}}}"#,
        ),
        ok: 200,
    },
    Operation {
        method: "post",
        path: "/api/v1/users/{name}/tokens",
        summary: "A new API token for the user (shown once; the user or an admin)",
        body: Body::Json(r#"{"type": "object", "properties": {"label": {"type": "string"}}}"#),
        ok: 201,
    },
    Operation {
        method: "get",
        path: "/api/v1/users/{name}/tokens",
        summary: "The user's tokens: id, label and creation time, never the token (the user or an admin)",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "delete",
        path: "/api/v1/users/{name}/tokens/{token}",
        summary: "Revoke a token by its id (the user or an admin); refused from then on (other servers: within the token cache's 5 s)",
        body: Body::None,
        ok: 204,
    },
    Operation {
        method: "post",
        path: "/api/v1/admin/users/{name}/disable",
        summary: "Disable a user: every token of theirs is refused with a 403 (account-disabled); tasks stay (admin)",
        body: Body::None,
        ok: 204,
    },
    Operation {
        method: "post",
        path: "/api/v1/admin/users/{name}/enable",
        summary: "Enable a disabled user again (admin)",
        body: Body::None,
        ok: 204,
    },
    Operation {
        method: "get",
        path: "/api/v1/users/{name}/env",
        summary: "The user's TaskEnv (hidden values masked)",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "put",
        path: "/api/v1/users/{name}/env",
        summary: "Set a TaskEnv variable (a task's own variable of the same name wins)",
        body: Body::Json(
            r#"{"type": "object", "required": ["name", "value"], "properties": {"name": {"type": "string"}, "value": {"type": "string"}, "hidden": {"type": "boolean"}}}"#,
        ),
        ok: 204,
    },
    Operation {
        method: "delete",
        path: "/api/v1/users/{name}/env/{var}",
        summary: "Remove a TaskEnv variable",
        body: Body::None,
        ok: 204,
    },
    Operation {
        method: "get",
        path: "/api/v1/users/{name}/alarms",
        summary: "The user's alarm subscriptions",
        body: Body::None,
        ok: 200,
    },
    Operation {
        method: "put",
        path: "/api/v1/users/{name}/alarms",
        summary: "Replace the user's alarm subscriptions",
        body: Body::Json(r#"{"type": "array"}"#),
        ok: 200,
    },
    Operation {
        method: "get",
        path: "/metrics",
        summary: "Prometheus metrics of the server",
        body: Body::None,
        ok: 200,
    },
    Operation { method: "get", path: "/healthz", summary: "Liveness", body: Body::None, ok: 200 },
];

/// The document.
pub fn document() -> Value {
    let mut paths = serde_json::Map::new();
    for op in OPERATIONS {
        let mut operation = json!({
            "summary": op.summary,
            "responses": {
                op.ok.to_string(): {"description": "done"},
                "default": {"description": "a problem", "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}
            }
        });
        if op.path.contains("{id}") {
            operation["parameters"] =
                json!([{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}]);
        }
        if op.path.starts_with("/api/v1") {
            operation["security"] = json!([{"bearer": []}]);
        }
        match op.body {
            Body::None => {}
            Body::Task => {
                operation["requestBody"] = json!({"required": true, "content": {
                    "application/json": {"schema": {"$ref": "#/components/schemas/TrainingTask"}},
                    "application/yaml": {"schema": {"$ref": "#/components/schemas/TrainingTask"}}
                }});
            }
            Body::Json(schema) => {
                let schema: Value =
                    serde_json::from_str(schema).expect("the operation table holds valid JSON schemas");
                operation["requestBody"] =
                    json!({"required": true, "content": {"application/json": {"schema": schema}}});
            }
        }
        let entry = paths.entry(op.path.to_owned()).or_insert_with(|| json!({}));
        entry[op.method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Trainyard API", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Submit and run PyTorchJob and RayJob training tasks. Errors are RFC 9457 problem details; a task the caller may not see is a 404."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "TrainingTask": TrainingTask::schema(),
                "Problem": {"type": "object", "properties": {
                    "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                    "detail": {"type": "string"},
                    "problems": {"type": "array", "items": {"type": "object", "properties": {
                        "path": {"type": "string"}, "code": {"type": "string"},
                        "severity": {"type": "string", "enum": ["error", "warning"]}, "message": {"type": "string"}}}}
                }}
            }
        }
    })
}

/// A page that renders the document in the browser, with nothing fetched from anywhere but this server.
pub const DOCS_PAGE: &str = r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Trainyard API</title>
<style>body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}
code,pre{font:13px ui-monospace,monospace}pre{background:#f5f5f5;padding:.75rem;overflow:auto;max-height:30rem}
.m{display:inline-block;min-width:4rem;font-weight:bold;text-transform:uppercase}</style></head>
<body><h1>Trainyard API</h1><p>The OpenAPI 3.1 document: <a href="/api/openapi.json">/api/openapi.json</a>.</p>
<div id="ops"></div><h2>TrainingTask schema</h2><pre id="schema"></pre>
<script>
fetch('/api/openapi.json').then(r => r.json()).then(doc => {
  const ops = document.getElementById('ops');
  for (const [path, item] of Object.entries(doc.paths)) {
    for (const [method, op] of Object.entries(item)) {
      const p = document.createElement('p');
      const m = document.createElement('span'); m.className = 'm'; m.textContent = method;
      const c = document.createElement('code'); c.textContent = path;
      p.append(m, c, document.createElement('br'), op.summary);
      ops.append(p);
    }
  }
  document.getElementById('schema').textContent = JSON.stringify(doc.components.schemas.TrainingTask, null, 2);
});
</script></body></html>
"#;
