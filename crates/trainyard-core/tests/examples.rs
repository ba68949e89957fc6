//! The shipped examples: every task in `examples/` validates clean against the example catalog and reads
//! back unchanged from YAML and JSON; every file in `examples/invalid/` produces exactly the problems listed
//! in its `.expected` file (`TRAINYARD_BLESS=1` rewrites them after a deliberate change).

// Tests are the shell: they read the shipped examples and their expected reports.
#![allow(clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use trainyard_core::{Catalog, TrainingTask, check, parse};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn catalog() -> Catalog {
    let text = std::fs::read_to_string(root().join("catalog/catalog.yaml")).unwrap();
    Catalog::from_yaml(&text).unwrap()
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn reparse(text: &str) -> TrainingTask {
    let (task, d) = parse(text.as_bytes());
    assert!(d.report.problems.is_empty(), "{:#?}\n{text}", d.report.problems);
    task.unwrap()
}

#[test]
fn examples_validate_clean_and_round_trip() {
    let catalog = catalog();
    let files = yaml_files(&root());
    assert!(files.len() >= 6, "expected the shipped examples, found {files:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        let checked = check(&bytes, &catalog);
        assert!(checked.report.problems.is_empty(), "{}: {:#?}", f.display(), checked.report.problems);
        let task = checked.task.unwrap();
        assert_eq!(reparse(&task.to_yaml()), task, "{} through YAML", f.display());
        assert_eq!(reparse(&task.to_json()), task, "{} through JSON", f.display());
    }
}

fn render(checked: &trainyard_core::Checked) -> String {
    let mut out = String::new();
    for p in &checked.report.problems {
        let sev = match p.severity {
            trainyard_core::Severity::Error => "error",
            trainyard_core::Severity::Warning => "warning",
        };
        out.push_str(&format!("{sev} {} {}\n", p.code, p.path));
    }
    out
}

#[test]
fn invalid_examples_report_exactly_their_expected_problems() {
    let catalog = catalog();
    let bless = std::env::var_os("TRAINYARD_BLESS").is_some();
    let files = yaml_files(&root().join("invalid"));
    assert!(files.len() >= 8, "expected the invalid examples, found {files:?}");
    let mut failures = Vec::new();
    for f in files {
        let checked = check(&std::fs::read(&f).unwrap(), &catalog);
        assert!(!checked.report.is_ok(), "{} should be invalid", f.display());
        let got = render(&checked);
        let expected_path = f.with_extension("expected");
        if bless {
            std::fs::write(&expected_path, &got).unwrap();
            continue;
        }
        let want = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{} is missing; run with TRAINYARD_BLESS=1", expected_path.display()));
        if got != want {
            failures.push(format!("{}:\n--- expected\n{want}--- got\n{got}", f.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
