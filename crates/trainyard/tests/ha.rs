//! Several servers on one store. A SQLite store serves one server: a second `trainyard up` on the same data
//! dir, or on the same database from another data dir, is refused with the first one's pid, and a server
//! killed with `kill -9` leaves nothing that refuses the next.

mod common;

use common::{Options, Server};
use std::process::{Command, Stdio};

/// `trainyard up` with `args`, expected to refuse to start: what it printed.
fn refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_trainyard"))
        .arg("up")
        .args(["--backend", "fake", "--listen", "127.0.0.1:0"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let printed = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "a second server started:\n{printed}");
    printed
}

#[test]
fn a_sqlite_store_serves_one_server_and_a_second_is_refused_with_the_first_ones_pid() {
    let mut first = Server::start_with(
        "ha-sqlite-one",
        Options { args: vec!["--backend".into(), "fake".into()], ..Options::default() },
    );
    let pid = first.pid().unwrap();
    let dir = first.dir.display().to_string();

    // The same data dir.
    let said = refused(&["--data-dir", &dir]);
    assert!(said.contains("another trainyard server") && said.contains(&format!("pid {pid}")), "{said}");

    // Another data dir, the same database file.
    let other = std::env::temp_dir().join(format!("ty-ha-sqlite-two-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&other);
    let url = format!("sqlite://{dir}/trainyard.db");
    let said = refused(&["--data-dir", other.to_str().unwrap(), "--database-url", &url]);
    assert!(
        said.contains("SQLite store") && said.contains("PostgreSQL") && said.contains(&format!("pid {pid}"))
    );

    // The first still serves, alone.
    let (status, body) = first.call("GET", "/api/v1/tasks", None);
    assert_eq!(status, 200, "{body}");

    // Killed, it holds nothing: the next start on the same data dir is taken.
    first.restart();
    let (status, body) = first.call("GET", "/api/v1/tasks", None);
    assert_eq!(status, 200, "{body}");
    std::fs::remove_dir_all(&other).unwrap();
}
