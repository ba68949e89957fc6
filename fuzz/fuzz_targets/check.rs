//! Fuzzes the whole path from bytes to problems: `check` against the example catalog never panics and
//! always returns a task or a problem; a task that comes back serialises, and its YAML reads back as the
//! same task with no decoding problem. The same bytes go through the Prometheus text reader.

#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;
use trainyard_core::{Catalog, check, parse};

static CATALOG: LazyLock<Catalog> = LazyLock::new(|| {
    Catalog::from_yaml(include_str!("../../examples/catalog/catalog.yaml"))
        .expect("the example catalog loads")
});

fuzz_target!(|data: &[u8]| {
    // The metrics monitor's reader of scraped pages shares the input: it must never panic either, and
    // keeps no more than its limit.
    let page = trainyard_core::promtext::parse(&String::from_utf8_lossy(data));
    assert!(page.samples.len() <= trainyard_core::promtext::MAX_SAMPLES);
    let checked = check(data, &CATALOG);
    assert!(checked.task.is_some() || !checked.report.problems.is_empty(), "no task and no problem");
    if let Some(task) = &checked.task {
        // Whatever was decoded (defaults standing in for what failed) is a well-formed task.
        let yaml = task.to_yaml();
        let (back, d) = parse(yaml.as_bytes());
        assert!(
            d.report.problems.is_empty(),
            "the YAML of a decoded task has problems: {:?}\n{yaml}",
            d.report.problems
        );
        assert!(back.as_ref() == Some(task), "the YAML of a decoded task reads back differently:\n{yaml}");
    }
});
