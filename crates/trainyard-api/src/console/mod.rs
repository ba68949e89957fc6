//! The web console: a page and a few small hand-written modules, embedded in the binary and served by the
//! server itself (no CDN, no build step). It talks to the same HTTP API as the CLI, with the user's token.

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;

const INDEX: &str = include_str!("index.html");
const APP_JS: &str = include_str!("app.js");
const STYLE: &str = include_str!("style.css");

fn asset(kind: &'static str, body: &'static str) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, kind), (header::CACHE_CONTROL, "no-cache")], body)
}

/// `/` (the console) and its assets under `/console/`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/console/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/console/style.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
}
