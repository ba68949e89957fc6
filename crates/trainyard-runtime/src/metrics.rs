//! The metrics a replica exposes, as every backend keeps them: samples scraped from the task's endpoints in
//! the Prometheus text format, and the `metrics.jsonl` file they are kept in, one [`Point`] per line.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::time::Duration;

/// One sample as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Unix time, ms.
    pub t: u64,
    /// Metric name; preset ones start with `trainyard_`.
    pub n: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub l: BTreeMap<String, String>,
    pub v: f64,
}

/// Most bytes read from one endpoint.
const MAX_PAGE: u64 = 4 << 20;

/// The most samples kept from one scrape of one endpoint (a task can expose as many series as it likes).
pub const MAX_SAMPLES_PER_SCRAPE: usize = 2_000;

/// The most a replica's `metrics.jsonl` may hold on the host's disk; past it, no more points are kept.
pub const MAX_METRICS_FILE_BYTES: u64 = 64 << 20;

/// `GET http://127.0.0.1:PORT/PATH` with short timeouts; the body on a 200.
pub fn http_get(port: u16, path: &str) -> Result<String, String> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s =
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(Duration::from_secs(2))).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAccept: text/plain\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    s.take(MAX_PAGE).read_to_end(&mut buf).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no HTTP response")?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!("HTTP status {status}"));
    }
    Ok(body.to_owned())
}

/// One scrape of an endpoint as samples: the page's (finite ones, at most [`MAX_SAMPLES_PER_SCRAPE`]) when it
/// answered (`page`), and `trainyard_scrape_up` 1 or 0 for the endpoint either way.
pub fn scraped(t: u64, port: u16, path: &str, page: Option<&str>, out: &mut Vec<Point>) {
    if let Some(body) = page {
        let page = trainyard_core::promtext::parse(body);
        out.extend(
            page.samples
                .into_iter()
                .filter(|s| s.value.is_finite())
                .take(MAX_SAMPLES_PER_SCRAPE)
                .map(|s| Point { t, n: s.name, l: s.labels, v: s.value }),
        );
    }
    let l = BTreeMap::from([("endpoint".to_owned(), format!(":{port}{path}"))]);
    out.push(Point { t, n: "trainyard_scrape_up".into(), l, v: if page.is_some() { 1.0 } else { 0.0 } });
}

/// Appends samples to a metrics file, one JSON line each, unless that would take it past
/// [`MAX_METRICS_FILE_BYTES`] (the file is on the host's disk and the task decides how much it exposes).
pub fn append(file: &mut std::fs::File, points: &[Point]) {
    let mut buf = Vec::new();
    for p in points {
        if serde_json::to_writer(&mut buf, p).is_ok() {
            buf.push(b'\n');
        }
    }
    let kept = file.metadata().map_or(0, |m| m.len());
    if kept + buf.len() as u64 <= MAX_METRICS_FILE_BYTES {
        let _ = file.write_all(&buf);
    }
}
