//! Why a replica ended, in words a user can act on: its exit code or signal, whether the kernel killed it
//! for memory, and what its last log lines say. The result is a lifecycle [`Reason`] (which decides whether
//! the attempt is retried) and a message that names the cause and what to change.

use crate::lifecycle::Reason;

/// How one replica's process ended, as its supervisor saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exit {
    /// The exit code when it exited by itself.
    pub code: Option<i32>,
    /// The signal that ended it, otherwise.
    pub signal: Option<i32>,
    /// The memory limit's OOM killer fired in the replica's cgroup.
    pub oom_killed: bool,
}

/// Log lines that mean the code ran out of memory on the GPU or the host.
const OOM_PATTERNS: &[&str] = &[
    "CUDA out of memory",
    "CUDA error: out of memory",
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "MemoryError",
    "std::bad_alloc",
    "Cannot allocate memory",
];

/// Log lines that mean the machine, not the code, is at fault: the attempt is retried elsewhere.
const HARDWARE_PATTERNS: &[&str] = &[
    "uncorrectable ECC error",
    "Xid",
    "GPU has fallen off the bus",
    "NCCL error: unhandled system error",
    "CUDA error: an illegal memory access was encountered on device",
];

/// The conventional name of a signal number (Linux numbering).
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    name.to_owned()
}

/// Classifies one replica's end. `log_tail` is the end of its output (both streams); `mount_paths` are the
/// task's mount paths, so a missing file under one of them is reported as a data problem.
pub fn classify(replica: &str, exit: &Exit, log_tail: &str, mount_paths: &[&str]) -> (Reason, String) {
    let last_line = log_tail.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("");
    let how = match (exit.code, exit.signal) {
        (Some(0), _) => return (Reason::Completed, format!("{replica} exited with code 0")),
        // A shell reports a child killed by a signal as 128 + the signal.
        (Some(c), _) if (129..160).contains(&c) => {
            format!("exited with code {c} (killed by {})", signal_name(c - 128))
        }
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(s)) => format!("was killed by {}", signal_name(s)),
        (None, None) => "ended without an exit status".to_owned(),
    };
    if exit.oom_killed {
        return (
            Reason::OutOfMemory,
            format!(
                "{replica} {how}: it used more memory than its instance spec allows and the kernel stopped it; \
                 choose a larger instance spec or use less memory (smaller batches, fewer data-loader workers)"
            ),
        );
    }
    if let Some(p) = OOM_PATTERNS.iter().find(|p| log_tail.contains(*p)) {
        return (
            Reason::OutOfMemory,
            format!(
                "{replica} {how} after running out of memory (its log says \"{p}\"); lower the batch size or \
                 choose an instance spec with more memory"
            ),
        );
    }
    if let Some(p) = HARDWARE_PATTERNS.iter().find(|p| log_tail.contains(*p)) {
        return (
            Reason::NodeFailed,
            format!("{replica} {how} after a hardware error on its node (its log says \"{p}\")"),
        );
    }
    for line in log_tail.lines().rev() {
        if !line.contains("No such file or directory") {
            continue;
        }
        if let Some(m) = mount_paths.iter().find(|m| line.contains(*m)) {
            return (
                Reason::UserError,
                format!(
                    "{replica} {how}: a path under the mount {m} does not exist ({}); check the path in the \
                     command and what the volume, dataset or model holds",
                    line.trim()
                ),
            );
        }
    }
    let hint = if last_line.is_empty() { String::new() } else { format!("; last log line: {last_line}") };
    (Reason::UserError, format!("{replica} {how}{hint}"))
}

/// The exit code a [`classify`] message states (`... exited with code 3 ...`), for a client that exits as its
/// task did.
pub fn exit_code_in(message: &str) -> Option<i32> {
    let (_, rest) = message.split_once(" exited with code ")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit() || *c == '-').collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_exit_code_is_read_back_from_every_message_that_states_one() {
        let tail = "Traceback\nValueError: bad";
        for c in [0, 1, 3, 137, 255] {
            let (_, m) = classify("t-master-0", &code(c), tail, &[]);
            assert_eq!(exit_code_in(&m), Some(c), "{m}");
        }
        let oom = Exit { code: Some(137), oom_killed: true, ..Exit::default() };
        assert_eq!(exit_code_in(&classify("t-master-0", &oom, "", &[]).1), Some(137));
        let killed = Exit { signal: Some(9), ..Exit::default() };
        assert_eq!(exit_code_in(&classify("t-master-0", &killed, "", &[]).1), None);
    }

    fn code(c: i32) -> Exit {
        Exit { code: Some(c), ..Exit::default() }
    }

    #[test]
    fn exit_codes_signals_and_memory() {
        assert_eq!(classify("m-0", &code(0), "", &[]).0, Reason::Completed);
        let (r, m) = classify("m-0", &code(3), "Traceback\nValueError: bad lr\n", &[]);
        assert_eq!(r, Reason::UserError);
        assert!(m.contains("code 3") && m.contains("ValueError: bad lr"), "{m}");
        let (_, m) = classify("m-0", &code(137), "", &[]);
        assert!(m.contains("code 137 (killed by SIGKILL)"), "{m}");
        let (r, m) = classify("m-0", &Exit { signal: Some(11), ..Exit::default() }, "", &[]);
        assert_eq!(r, Reason::UserError);
        assert!(m.contains("SIGSEGV"), "{m}");
        let oom = Exit { signal: Some(9), oom_killed: true, ..Exit::default() };
        assert_eq!(classify("w-1", &oom, "", &[]).0, Reason::OutOfMemory);
        let (r, m) = classify("w-1", &code(1), "RuntimeError: CUDA out of memory. Tried to allocate", &[]);
        assert_eq!(r, Reason::OutOfMemory);
        assert!(m.contains("batch size"), "{m}");
    }

    #[test]
    fn a_missing_path_under_a_mount_is_named() {
        let log = "FileNotFoundError: [Errno 2] No such file or directory: '/mnt/data/train.csv'";
        let (r, m) = classify("m-0", &code(1), log, &["/mnt/data", "/volume/out"]);
        assert_eq!(r, Reason::UserError);
        assert!(m.contains("/mnt/data") && m.contains("train.csv"), "{m}");
        // Not under a mount: an ordinary user error with the last line.
        let (_, m) = classify("m-0", &code(1), "No such file or directory: 'x.py'", &["/mnt/data"]);
        assert!(m.contains("last log line"), "{m}");
    }

    #[test]
    fn hardware_errors_are_the_nodes_fault() {
        let (r, _) = classify("w-0", &code(1), "NCCL error: unhandled system error", &[]);
        assert_eq!(r, Reason::NodeFailed);
    }
}
