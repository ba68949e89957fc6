//! Tests of the pure parts of `capture`: timestamps, lines, the cursor, the store's reads.

use super::*;
use futures_util::FutureExt;

#[test]
fn timestamps_become_keys_that_sort_in_time_order() {
    assert_eq!(ts_key("2026-01-01T00:00:01Z").unwrap(), "2026-01-01T00:00:01.000000000Z");
    assert_eq!(ts_key("2026-01-01T00:00:01.5Z").unwrap(), "2026-01-01T00:00:01.500000000Z");
    // Trimmed fractions compare wrongly as text; their keys do not.
    assert!("2026-01-01T00:00:01.1Z" > "2026-01-01T00:00:01.12Z");
    assert!(ts_key("2026-01-01T00:00:01.1Z") < ts_key("2026-01-01T00:00:01.12Z"));
    for bad in
        ["", "hello", "2026-01-01T00:00:01+01:00", "2026-01-01T00:00:01.1234567890Z", "2026-01-01T00:00:01.x"]
    {
        assert_eq!(ts_key(bad), None, "{bad}");
    }
}

#[test]
fn a_line_of_the_log_api_becomes_a_kept_line() {
    let (key, line) = log_line("2026-01-01T00:00:01.123456789Z step 1 loss 0.5").unwrap();
    assert_eq!(key, "2026-01-01T00:00:01.123456789Z");
    assert_eq!(line, "2026-01-01T00:00:01.123Z O step 1 loss 0.5\n");
    assert_eq!(log_line("2026-01-01T00:00:01Z").unwrap().1, "2026-01-01T00:00:01.000Z O \n");
    assert_eq!(log_line("no timestamp here"), None);
}

#[test]
fn a_line_without_an_end_is_cut_not_kept_whole() {
    let long = "x".repeat(MAX_LINE_BYTES * 3);
    let text = format!("2026-01-01T00:00:01Z {long}\n2026-01-01T00:00:02Z short\nno end");
    let mut r = futures_util::io::Cursor::new(text.into_bytes());
    let (mut buf, mut cut) = (Vec::new(), false);
    assert!(read_line(&mut r, &mut buf, &mut cut).now_or_never().unwrap().unwrap());
    assert_eq!((buf.len(), cut), (MAX_LINE_BYTES, true));
    buf.clear();
    cut = false;
    assert!(read_line(&mut r, &mut buf, &mut cut).now_or_never().unwrap().unwrap());
    assert_eq!((buf.as_slice(), cut), (&b"2026-01-01T00:00:02Z short"[..], false));
    buf.clear();
    assert!(!read_line(&mut r, &mut buf, &mut cut).now_or_never().unwrap().unwrap(), "the end");
    assert_eq!(buf, b"no end", "what came before the end is there");
}

#[test]
fn a_resumed_stream_keeps_only_what_is_new() {
    // Kept so far: up to the second line of 00:00:01.000000000.
    let at = |s: &str| ts_key(s).unwrap();
    let cursor = Cursor { ts: at("2026-01-01T00:00:01Z"), same: 2 };
    let mut d = Dedup::new(cursor);
    // The stream opened with sinceTime=00:00:01 repeats that second.
    assert!(!d.keep(&at("2026-01-01T00:00:00.5Z")), "older");
    assert!(!d.keep(&at("2026-01-01T00:00:01Z")), "first of the second, kept before");
    assert!(!d.keep(&at("2026-01-01T00:00:01Z")), "second of the second, kept before");
    assert!(d.keep(&at("2026-01-01T00:00:01Z")), "a third line of that instant is new");
    assert_eq!(d.now, Cursor { ts: at("2026-01-01T00:00:01Z"), same: 3 });
    assert!(d.keep(&at("2026-01-01T00:00:02Z")));
    assert!(d.keep(&at("2026-01-01T00:00:02Z")));
    assert_eq!(d.now, Cursor { ts: at("2026-01-01T00:00:02Z"), same: 2 });
    // A fresh log keeps everything.
    let mut fresh = Dedup::new(Cursor::default());
    assert!(fresh.keep(&at("2026-01-01T00:00:00Z")));
}

#[test]
fn the_files_keep_whole_lines_with_the_cursor_and_say_when_a_log_is_complete() {
    let dir = std::env::temp_dir().join(format!("ty-kube-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = FileArchive::new(dir.clone());
    let key = AttemptKey { task_id: "t/../x".into(), attempt: 2 };
    let now = |f: Fut<'_, LogChunk>| f.now_or_never().unwrap();
    assert!(now(files.read_log(&key, "p", 0, 100)).missing);
    assert_eq!(files.replica(&key, "p").now_or_never().unwrap(), Ok(None));
    files.add_replica(&key, "p", "worker").now_or_never().unwrap().unwrap();
    assert!(files.attempt_dir(&key).starts_with(&dir), "a task id names no path outside the archive");
    let cursor = Cursor { ts: ts_key("2026-01-01T00:00:01Z").unwrap(), same: 2 };
    files.append_log(&key, "p", "a\nbb\n", &cursor.text()).now_or_never().unwrap().unwrap();
    std::fs::write(files.file(&key, "p", "log"), "a\nbb\nccc").unwrap();
    let kept = files.replica(&key, "p").now_or_never().unwrap().unwrap().unwrap();
    assert_eq!((kept.role.as_str(), kept.log_bytes, kept.ended), ("worker", 8, false));
    assert_eq!(Cursor::parse(&kept.cursor), cursor, "the cursor comes back as it was saved");
    let c = now(files.read_log(&key, "p", 0, 4));
    assert_eq!((c.data.as_slice(), c.next, c.ended, c.missing), (&b"a\n"[..], 2, false, false));
    let c = now(files.read_log(&key, "p", 2, 100));
    assert_eq!(c.data, b"bb\n", "the unfinished last line waits");
    let t = Target {
        key: key.clone(),
        namespace: "n".into(),
        pod: "p".into(),
        container: "c".into(),
        role: "worker".into(),
    };
    let archive: Arc<dyn Archive> = Arc::new(files.clone());
    finish(&archive, &t).now_or_never().unwrap();
    assert!(now(files.read_log(&key, "p", 5, 100)).ended);
    assert_eq!(files.replicas(&key).now_or_never().unwrap(), [("p".to_owned(), "worker".to_owned())]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A driver's log, read whole each time from the Ray job API: only the whole lines past what was kept, all of
/// it once the job is over, and from the start again when the text is not the one read before.
#[test]
fn a_drivers_log_is_kept_line_by_line_from_where_it_stood() {
    let text = "step 1\nstep 2\npartial";
    let (lines, next) = driver_lines(text, 0, false);
    assert_eq!((lines, next), (vec!["step 1", "step 2"], 14));
    // Nothing new yet: the unfinished line waits.
    assert_eq!(driver_lines(text, 14, false), (vec![], 14));
    let grown = "step 1\nstep 2\npartial line\r\ndone\n";
    assert_eq!(driver_lines(grown, 14, false), (vec!["partial line", "done"], grown.len()));
    // The job is over: the last line is kept without its end.
    assert_eq!(driver_lines(text, 14, true), (vec!["partial"], text.len()));
    // Past the end, or inside a character: another text, read from its start.
    assert_eq!(driver_lines("a\n", 99, false), (vec!["a"], 2));
    assert_eq!(driver_lines("é\n", 1, false), (vec!["é"], 3));
}
