//! The OpenAPI 3.1 document, built from the operation table ([`OPERATIONS`]) and the schemas of the bodies
//! ([`crate::schema`]: the task's from its decoder, the answers' from their types), served at
//! `/api/openapi.json`, and a page that renders it with no network access at `/api/docs`.

pub use crate::operations::{Answer, Body, OPERATIONS, Operation, Param, SchemaFn};
use crate::operations::{path_parameter, problem_schema};
use crate::schema::Schemas;
use serde_json::{Map, Value, json};

/// What an error status means, for the document.
fn error_description(status: u16) -> &'static str {
    match status {
        400 => "The request is malformed: a body or query that does not parse, or a value out of bounds",
        401 => "No token, or an unknown or revoked one",
        403 => "Not allowed: the caller's role, group or rights, or a disabled account (account-disabled)",
        404 => "No such task (or one the caller may not see), user, node, token, variable or replica",
        409 => {
            "In conflict with the current state (the task's status, an Idempotency-Key used for another body, or a catalog that takes away what active tasks use: `conflicts` lists each)"
        }
        413 => "The body is too large",
        422 => "The document has problems: `problems` lists each with its path and code",
        429 => {
            "The owner has as many queued tasks as one user may (too-many-queued: `limit` and `queued` say how many); Retry-After says when to try again"
        }
        414 => "The path and query are too long",
        500 => "The server failed (its log says why)",
        503 => {
            "The server has as many connections open as it serves (`trainyard up --max-connections`), or (`/healthz`) its store cannot write; Retry-After says when to try again"
        }
        507 => {
            "The disk holding the server's store is full (insufficient-storage): nothing of the request was stored; once an operator frees space, the same request succeeds, with no restart"
        }
        _ => "A problem",
    }
}

/// The statuses any request may be answered with, whatever its operation: a request target over
/// [`crate::error::MAX_URI_BYTES`], a failure of the server, a connection over the cap. Listed on every
/// operation rather than as a `default` answer, so that a status an operation does not list is a bug a
/// client or a fuzzer can find.
const ANY_OPERATION: [u16; 3] = [414, 500, 503];

/// The error statuses an operation answers with: its own and those of its kind (see [`Operation::errors`]).
pub fn error_statuses(op: &Operation) -> Vec<u16> {
    let mut statuses = op.errors.to_vec();
    // Every operation refuses a query parameter it does not take.
    statuses.push(400);
    if op.path.starts_with("/api/v1/") || op.path == "/metrics" {
        statuses.extend([401, 403]);
    }
    if !matches!(op.body, Body::None) {
        statuses.push(413);
    }
    // Every operation but a read may write to the store, and its disk may be full.
    if op.method != "get" {
        statuses.push(507);
    }
    statuses.extend(ANY_OPERATION);
    statuses.sort_unstable();
    statuses.dedup();
    statuses
}

fn success(op: &Operation, schemas: &mut Schemas) -> Value {
    let text = json!({"schema": {"type": "string"}});
    match op.answer {
        Answer::Empty => json!({"description": "Done; no body"}),
        Answer::Json(schema) => {
            json!({"description": "Done", "content": {"application/json": {"schema": schema(schemas)}}})
        }
        Answer::Text => json!({"description": "Done", "content": {"text/plain": text}}),
        Answer::Tar => json!({"description": "A tar stream", "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        }}),
        Answer::Logs(schema) => {
            json!({"description": "The replicas (JSON), a log (text) or its stream (server-sent events)", "content": {
                "application/json": {"schema": schema(schemas)},
                "text/plain": text,
                "text/event-stream": text,
            }})
        }
    }
}

fn request_body(body: &Body, schemas: &mut Schemas) -> Option<Value> {
    Some(match body {
        Body::None => return None,
        Body::Document(schema) => {
            let schema = schema(schemas);
            json!({"required": true, "content": {
                "application/json": {"schema": schema},
                "application/yaml": {"schema": schema},
            }})
        }
        Body::Json(schema) => {
            json!({"required": true, "content": {"application/json": {"schema": schema(schemas)}}})
        }
        Body::OptionalJson(schema) => {
            json!({"required": false, "content": {"application/json": {"schema": schema(schemas)}}})
        }
        Body::Tar => {
            json!({"required": true, "description": "a tar stream (ustar or GNU)", "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            }})
        }
    })
}

/// The names of a path's parameters (`/api/v1/users/{name}/tokens/{token}`: name, token).
pub fn path_parameters(path: &str) -> impl Iterator<Item = &str> {
    path.split('/').filter_map(|s| s.strip_prefix('{')?.strip_suffix('}'))
}

/// Operations whose success answers give the values of path parameters.
struct LinkSource {
    /// The operations' ids.
    from: &'static [&'static str],
    /// Each path parameter the answer gives, with the JSON pointer to its value in the answer.
    gives: &'static [(&'static str, &'static str)],
}

/// A task (its id), a new token (its user and id), a user (the name).
const LINK_SOURCES: &[LinkSource] = &[
    LinkSource {
        from: &["createTask", "cloneTask", "getTask", "stopTask", "resubmitTask"],
        gives: &[("id", "/id")],
    },
    LinkSource { from: &["createToken"], gives: &[("name", "/user"), ("token", "/id")] },
    LinkSource { from: &["whoami", "saveUser"], gives: &[("name", "/name")] },
];

/// The OpenAPI links of `op`'s success answers: to every operation whose path parameters the answer gives
/// all of, so a client (or a fuzzer's stateful run) goes from a created task to its reads and changes, from
/// a new token to its revocation, without building paths. `None` for an answer that gives none.
pub fn links(op: &Operation) -> Option<Value> {
    let source = LINK_SOURCES.iter().find(|s| s.from.contains(&op.id))?;
    let pointer = |name: &str| source.gives.iter().find(|(n, _)| *n == name).map(|(_, p)| *p);
    let mut out = Map::new();
    for target in OPERATIONS {
        let wanted: Vec<&str> = path_parameters(target.path).collect();
        let Some(filled) = wanted.iter().map(|n| Some((*n, pointer(n)?))).collect::<Option<Vec<_>>>() else {
            continue;
        };
        if filled.is_empty() {
            continue;
        }
        let parameters: Map<String, Value> =
            filled.iter().map(|(n, p)| ((*n).to_owned(), json!(format!("$response.body#{p}")))).collect();
        let fields: Vec<&str> = filled.iter().map(|(_, p)| p.trim_start_matches('/')).collect();
        let description = format!(
            "{} {} for this answer's {}",
            target.method.to_uppercase(),
            target.path,
            fields.join(" and ")
        );
        out.insert(
            target.id.to_owned(),
            json!({"operationId": target.id, "parameters": parameters, "description": description}),
        );
    }
    Some(Value::Object(out))
}

/// The path's parameters, then the query's, then the headers'. Query parameters are each optional; a
/// parameter not listed is refused (400).
fn parameters(op: &Operation, schemas: &mut Schemas) -> Vec<Value> {
    let mut out: Vec<Value> = path_parameters(op.path)
        .map(|name| {
            let (what, schema) = path_parameter(name).unwrap_or(("", json!({"type": "string"})));
            json!({"name": name, "in": "path", "required": true, "description": what, "schema": schema})
        })
        .collect();
    for (place, params) in [("query", op.query), ("header", op.headers)] {
        out.extend(params.iter().map(|p| {
            json!({"name": p.name, "in": place, "required": false, "description": p.description,
                   "schema": (p.schema)(schemas)})
        }));
    }
    out
}

/// The document.
pub fn document() -> Value {
    let mut schemas = Schemas::new();
    let problem = problem_schema(&mut schemas);
    let problem_answer = |description: &str| json!({"description": description, "content": {"application/problem+json": {"schema": problem}}});
    let mut paths = Map::new();
    for op in OPERATIONS {
        let mut responses = Map::new();
        let mut ok = success(op, &mut schemas);
        if let Some(links) = links(op) {
            ok["links"] = links;
        }
        for status in std::iter::once(&op.ok).chain(op.also_ok) {
            responses.insert(status.to_string(), ok.clone());
        }
        for status in error_statuses(op) {
            let mut answer = problem_answer(error_description(status));
            if matches!(status, 429 | 503) {
                answer["headers"] = json!({"Retry-After": {
                    "description": "Seconds to wait before trying again",
                    "required": true,
                    "schema": {"type": "integer", "minimum": 0},
                }});
            }
            responses.insert(status.to_string(), answer);
        }
        let mut operation = json!({"operationId": op.id, "summary": op.summary, "responses": responses});
        let parameters = parameters(op, &mut schemas);
        if !parameters.is_empty() {
            operation["parameters"] = Value::Array(parameters);
        }
        if op.path.starts_with("/api/v1") || op.path == "/metrics" {
            operation["security"] = json!([{"bearer": []}]);
        }
        if let Some(body) = request_body(&op.body, &mut schemas) {
            operation["requestBody"] = body;
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
            "schemas": schemas,
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
