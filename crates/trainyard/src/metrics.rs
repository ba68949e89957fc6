//! `trainyard metrics TASK`: the preset resource metrics (`trainyard_*`) and the task's own (scraped from its
//! endpoints) of one attempt, one row per replica, metric and label set: the latest value, the smallest and
//! the largest, in their units. `-o json|yaml` prints the API's answer.

use crate::conn::{CallResult, Conn, Format, not_found, outln, resolve};
use serde_json::Value;
use std::process::ExitCode;

pub fn metrics(
    c: &Conn,
    task: &str,
    replica: Option<&str>,
    attempt: Option<i64>,
    format: Format,
) -> CallResult<ExitCode> {
    let id = resolve(c, task)?;
    let query = attempt.map_or(String::new(), |a| format!("?attempt={a}"));
    let (_, mut v) = c.call("GET", &format!("/api/v1/tasks/{id}/metrics{query}"), None, None)?;
    let attempt = v["attempt"].as_i64().unwrap_or(0);
    if let Some(r) = replica {
        let series = v["series"].as_array().cloned().unwrap_or_default();
        let mut names: Vec<String> =
            series.iter().filter_map(|s| s["replica"].as_str().map(str::to_owned)).collect();
        names.dedup();
        let kept: Vec<Value> = series.into_iter().filter(|s| replica_is(&s["replica"], r)).collect();
        if kept.is_empty() && !names.is_empty() {
            return Err(not_found(format!(
                "attempt {attempt} of {task} has no metrics of a replica {r:?}; it has some of {}",
                names.join(", ")
            )));
        }
        v["series"] = Value::Array(kept);
    }
    if format != Format::Table {
        crate::conn::print(&v, format);
        return Ok(ExitCode::SUCCESS);
    }
    let mut series: Vec<&Value> = v["series"].as_array().into_iter().flatten().collect();
    if series.is_empty() {
        eprintln!(
            "trainyard: no metrics of attempt {attempt} of {task} yet (the preset ones are sampled while replicas \
             run on the local backend; a task's own need spec.advanced.metrics)"
        );
        return Ok(ExitCode::SUCCESS);
    }
    // Each replica's preset metrics first, then its own.
    let name = |s: &Value| s["name"].as_str().unwrap_or("").to_owned();
    series.sort_by_key(|s| {
        (s["replica"].as_str().unwrap_or("").to_owned(), !name(s).starts_with("trainyard_"), name(s))
    });
    // Replica names without the task's name in front, when every one has it.
    let prefix = series
        .iter()
        .filter_map(|s| s["replica"].as_str())
        .map(|r| r.rsplitn(3, '-').nth(2).unwrap_or("").to_owned())
        .reduce(|a, b| if a == b { a } else { String::new() })
        .filter(|p| !p.is_empty())
        .map(|p| format!("{p}-"));
    let rows: Vec<Vec<String>> = series
        .iter()
        .map(|s| {
            let points: Vec<(i64, f64)> = s["points"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| Some((p[0].as_i64()?, p[1].as_f64()?)))
                .collect();
            let unit = Unit::of(&name(s));
            let (min, max) = points
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, x)| (lo.min(*x), hi.max(*x)));
            let replica = s["replica"].as_str().unwrap_or("");
            let labels: Vec<String> = s["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                .collect();
            let last = points.last();
            vec![
                prefix.as_deref().and_then(|p| replica.strip_prefix(p)).unwrap_or(replica).to_owned(),
                name(s),
                labels.join(","),
                last.map_or(String::new(), |(_, x)| unit.show(*x)),
                if points.is_empty() { String::new() } else { unit.show(min) },
                if points.is_empty() { String::new() } else { unit.show(max) },
                points.len().to_string(),
                last.map_or(String::new(), |(at, _)| crate::table::ago(*at)),
            ]
        })
        .collect();
    let header = ["REPLICA", "METRIC", "LABELS", "LATEST", "MIN", "MAX", "SAMPLES", "UPDATED"];
    for l in crate::table::render(&header, &rows, &[3, 4, 5, 6, 7]) {
        outln!("{l}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether a series' replica is `r`: its full name, or its role and index (`worker-1`).
fn replica_is(replica: &Value, r: &str) -> bool {
    replica.as_str().is_some_and(|n| n == r || n.ends_with(&format!("-{r}")))
}

/// A metric's unit, from its name's suffix as Prometheus names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    Bytes,
    Mib,
    Percent,
    Cores,
    Seconds,
    Plain,
}

impl Unit {
    fn of(name: &str) -> Unit {
        let suffix = |s: &str| name.ends_with(s);
        if suffix("_bytes") || suffix("_bytes_total") {
            Unit::Bytes
        } else if suffix("_mib") {
            Unit::Mib
        } else if suffix("_percent") {
            Unit::Percent
        } else if suffix("_cores") {
            Unit::Cores
        } else if suffix("_seconds") || suffix("_seconds_total") {
            Unit::Seconds
        } else {
            Unit::Plain
        }
    }

    fn show(self, x: f64) -> String {
        match self {
            Unit::Bytes => bytes(x),
            Unit::Mib => bytes(x * 1024.0 * 1024.0),
            Unit::Percent => format!("{} %", number(x)),
            Unit::Cores => format!("{} cores", number(x)),
            Unit::Seconds => format!("{} s", number(x)),
            Unit::Plain => number(x),
        }
    }
}

/// A size in B, KiB, MiB, GiB or TiB, three or four figures.
fn bytes(x: f64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = x;
    let mut i = 0;
    while v.abs() >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 { format!("{} B", number(v)) } else { format!("{v:.1} {}", units[i]) }
}

/// A number as people read it: whole numbers whole, others to four significant figures, never in
/// exponent notation unless it is very large or very small.
fn number(x: f64) -> String {
    if !x.is_finite() {
        return x.to_string();
    }
    if x.fract() == 0.0 && x.abs() < 1e15 {
        return format!("{x:.0}");
    }
    let magnitude = x.abs().log10().floor() as i32;
    if !(-6..15).contains(&magnitude) {
        return format!("{x:.3e}");
    }
    let decimals = (3 - magnitude).clamp(0, 9) as usize;
    let s = format!("{x:.decimals$}");
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_owned() } else { s }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_shown_in_their_units() {
        assert_eq!(Unit::of("trainyard_memory_rss_bytes").show(248_600_000.0), "237.1 MiB");
        assert_eq!(Unit::of("trainyard_gpu_memory_used_mib").show(2048.0), "2.0 GiB");
        assert_eq!(Unit::of("trainyard_gpu_utilization_percent").show(37.5), "37.5 %");
        assert_eq!(Unit::of("trainyard_cpu_cores").show(0.98761), "0.9876 cores");
        assert_eq!(Unit::of("train_loss").show(0.25), "0.25");
        assert_eq!(Unit::of("train_step").show(1234.0), "1234");
        assert_eq!(number(12345.678), "12346");
        assert_eq!(number(0.000_012_34), "0.00001234");
        assert_eq!(bytes(512.0), "512 B");
    }
}
