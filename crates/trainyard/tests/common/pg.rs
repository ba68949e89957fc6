//! A fresh database on the PostgreSQL server `TRAINYARD_TEST_DATABASE_URL` names (`scripts/with-postgres`
//! starts one): for the tests of several servers and for `ha-bench`.

use std::process::Command;

/// Creates (again, if it is there) the database `PREFIX_NAME_PID` and returns its URL.
pub fn fresh_database(prefix: &str, name: &str) -> String {
    let base = std::env::var("TRAINYARD_TEST_DATABASE_URL").expect(
        "several servers need PostgreSQL: run under scripts/with-postgres (scripts/test does), or set \
         TRAINYARD_TEST_DATABASE_URL to a PostgreSQL server",
    );
    let db = format!("{prefix}_{}_{}", name.replace('-', "_"), std::process::id());
    let ok = Command::new("psql")
        .env("PGOPTIONS", "--client-min-messages=warning")
        .arg(&base)
        .args(["-q", "-c", &format!("DROP DATABASE IF EXISTS {db}"), "-c", &format!("CREATE DATABASE {db}")])
        .status()
        .expect("psql runs")
        .success();
    assert!(ok, "psql could not create database {db}");
    format!("{}/{db}", base.rsplit_once('/').expect("a database URL").0)
}
