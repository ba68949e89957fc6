//! The web console: a page and a few small hand-written modules, embedded in the binary and served by the
//! server itself (no CDN, no build step). It talks to the same HTTP API as the CLI, with the user's token.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX: &str = include_str!("index.html");
const STYLE: &str = include_str!("style.css");

/// The console's modules by file name; `app.js` imports the rest.
const MODULES: &[(&str, &str)] = &[
    ("app.js", include_str!("app.js")),
    ("core.js", include_str!("core.js")),
    ("signin.js", include_str!("signin.js")),
    ("list.js", include_str!("list.js")),
    ("task.js", include_str!("task.js")),
    ("task-log.js", include_str!("task-log.js")),
    ("compare.js", include_str!("compare.js")),
    ("new.js", include_str!("new.js")),
    ("create.js", include_str!("create.js")),
    ("admin.js", include_str!("admin.js")),
    ("catalog.js", include_str!("catalog.js")),
    ("catalog-model.js", include_str!("catalog-model.js")),
    ("catalog-fields.js", include_str!("catalog-fields.js")),
    ("catalog-entries.js", include_str!("catalog-entries.js")),
    ("catalog-answers.js", include_str!("catalog-answers.js")),
    ("account.js", include_str!("account.js")),
    ("charts.js", include_str!("charts.js")),
    ("yaml.js", include_str!("yaml.js")),
];

fn asset(kind: &'static str, body: &'static str) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], body)
}

/// `/` (the console) and its assets under `/console/`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut router = Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/console/style.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }));
    for &(name, body) in MODULES {
        router = router.route(
            &format!("/console/{name}"),
            get(move || async move { asset("text/javascript; charset=utf-8", body) }),
        );
    }
    router
}
