//! `trainyard validate`: problems with their paths, or the demand table.

use crate::cli::Output;
use serde::Serialize;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use trainyard_core::demand::{Demand, Mib};
use trainyard_core::{Catalog, Problem, Severity, check, demand_options};

/// The example catalog, so `trainyard validate examples/*.yaml` works with no setup.
const EXAMPLE_CATALOG: &str = include_str!("../../../examples/catalog/catalog.yaml");

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct FileResult {
    file: String,
    valid: bool,
    problems: Vec<Problem>,
    /// One entry per instance spec option, in priority order; only for valid files.
    demand: Vec<Demand>,
}

/// Checks `files` against `catalog` (a file), else the catalog of the server `conn` reaches (unless
/// `offline`), else the example catalog built into this binary; which one is said on standard error.
pub fn run(
    files: &[PathBuf],
    catalog: Option<&Path>,
    conn: &crate::conn::Conn,
    offline: bool,
    output: Output,
) -> ExitCode {
    let (catalog, origin) = match load_catalog(catalog, (!offline).then_some(conn)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("trainyard: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!("trainyard: checked against {origin}");
    let mut results = Vec::with_capacity(files.len());
    let mut unreadable = false;
    for f in files {
        let name = f.display().to_string();
        let bytes = match read_input(f) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("trainyard: cannot read {name}: {e}");
                unreadable = true;
                continue;
            }
        };
        let checked = check(&bytes, &catalog);
        let demand = match checked.valid_task() {
            Some(t) => {
                // A valid task's specs all exist in the catalog, so the calculator cannot fail here.
                demand_options(&t.spec, &|s| catalog.instance_specs.get(s)).unwrap_or_default()
            }
            None => Vec::new(),
        };
        results.push(FileResult {
            file: name,
            valid: checked.report.is_ok(),
            problems: checked.report.problems,
            demand,
        });
    }
    match output {
        Output::Json => match serde_json::to_string_pretty(&results) {
            Ok(s) => crate::conn::outln!("{s}"),
            Err(e) => {
                eprintln!("trainyard: {e}");
                return ExitCode::from(2);
            }
        },
        Output::Table => {
            for r in &results {
                print_table(r);
            }
        }
    }
    if unreadable {
        ExitCode::from(2)
    } else if results.iter().all(|r| r.valid) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn load_catalog(path: Option<&Path>, conn: Option<&crate::conn::Conn>) -> Result<(Catalog, String), String> {
    let server = conn.and_then(|c| crate::conn::server_catalog(c).map(|text| (text, c.server.clone())));
    let (text, origin) = match (path, server) {
        (Some(p), _) => (
            std::fs::read_to_string(p).map_err(|e| format!("cannot read catalog {}: {e}", p.display()))?,
            format!("the catalog in {}", p.display()),
        ),
        (None, Some((text, server))) => (text, format!("the catalog of {server}")),
        (None, None) => {
            let why = match conn {
                Some(c) => format!(
                    " (no server answered at {} with a token; --catalog FILE names another)",
                    c.server
                ),
                None => String::new(),
            };
            (EXAMPLE_CATALOG.to_owned(), format!("the example catalog built into this binary{why}"))
        }
    };
    let catalog = Catalog::from_yaml(&text).map_err(|e| format!("{origin}: {e}"))?;
    Ok((catalog, origin))
}

fn read_input(path: &Path) -> std::io::Result<Vec<u8>> {
    // Read one byte past the limit so an oversized input is reported as such without reading all of it.
    let limit = trainyard_core::MAX_DOCUMENT_BYTES as u64 + 1;
    let mut buf = Vec::new();
    if path.as_os_str() == "-" {
        std::io::stdin().lock().take(limit).read_to_end(&mut buf)?;
    } else {
        std::fs::File::open(path)?.take(limit).read_to_end(&mut buf)?;
    }
    Ok(buf)
}

fn print_table(r: &FileResult) {
    let errors = r.problems.iter().filter(|p| p.severity == Severity::Error).count();
    let warnings = r.problems.len() - errors;
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    if r.valid {
        let w = if warnings > 0 { format!(" ({})", plural(warnings, "warning")) } else { String::new() };
        crate::conn::outln!("{}: valid{w}", r.file);
    } else {
        crate::conn::outln!("{}: {}, {}", r.file, plural(errors, "error"), plural(warnings, "warning"));
    }
    for p in &r.problems {
        crate::conn::outln!("  {p}");
    }
    let n = r.demand.len();
    for d in &r.demand {
        print_demand(d, n);
    }
}

fn print_demand(d: &Demand, options: usize) {
    let head = &d.roles[d.roles.len() - 1];
    crate::conn::outln!(
        "  demand with option {} of {options} ({} × {} per replica):",
        d.option + 1,
        head.spec,
        head.count_per_node
    );
    let rows: Vec<[String; 8]> = d
        .roles
        .iter()
        .map(|r| {
            [
                r.role.as_str().to_owned(),
                r.replicas.to_string(),
                r.spec.clone(),
                r.count_per_node.to_string(),
                r.units.to_string(),
                r.total.gpus.to_string(),
                r.total.vcpus.to_string(),
                Mib(r.total.memory_mib).to_string(),
            ]
        })
        .chain(std::iter::once([
            "total".to_owned(),
            d.replicas.to_string(),
            String::new(),
            String::new(),
            d.quota.iter().map(|q| q.units).sum::<u64>().to_string(),
            d.total.gpus.to_string(),
            d.total.vcpus.to_string(),
            Mib(d.total.memory_mib).to_string(),
        ]))
        .collect();
    let header = ["ROLE", "REPLICAS", "SPEC", "PER NODE", "UNITS", "GPUS", "VCPUS", "MEMORY"];
    let mut width = header.map(str::len);
    for row in &rows {
        for (w, cell) in width.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[&str]| {
        let mut s = String::from("   ");
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            // Names left-aligned, figures right-aligned.
            if i == 0 || i == 2 { s.push_str(&format!(" {c:<w$}")) } else { s.push_str(&format!(" {c:>w$}")) }
        }
        crate::conn::outln!("{}", s.trim_end());
    };
    line(&header);
    for row in &rows {
        line(&row.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let quota: Vec<String> = d
        .quota
        .iter()
        .map(|q| format!("{} unit{} of {}", q.units, if q.units == 1 { "" } else { "s" }, q.spec))
        .collect();
    crate::conn::outln!("    quota checked: {}", quota.join(", "));
}
