//! The command line: every verb, its flags and their help, as clap parses them. `main` dispatches what it
//! parses.

use crate::client::{self, Format};
use crate::table::ListFormat;
use crate::{DEFAULT_LISTEN, up};
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Trainyard: submit, follow and run PyTorchJob and RayJob training tasks. `trainyard up` runs the server on
/// this machine; the other verbs talk to a server over its HTTP API (`validate` also works offline).
#[derive(Debug, Parser)]
#[command(name = "trainyard", version, after_help = client::EXIT_CODES)]
pub struct Cli {
    /// The server's address [default: the config file's `server`, else http://127.0.0.1:8080].
    #[arg(long, global = true, env = "TRAINYARD_SERVER")]
    pub server: Option<String>,
    /// API token [default: the config file's `token`, else the admin token `trainyard up` saved in its data
    /// dir: $TRAINYARD_DATA_DIR/admin.token, else .trainyard/admin.token under the directory you run in, as
    /// an absolute path].
    #[arg(long, global = true, env = "TRAINYARD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A YAML file with `server:`, `token:` and `run`'s `defaults:` [default: ~/.config/trainyard/config.yaml].
    #[arg(long, global = true, env = "TRAINYARD_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

/// The task list's filters (`list`, and `delete` without a task).
#[derive(Debug, clap::Args)]
pub struct TaskFilters {
    /// Only tasks in this status (any case).
    #[arg(long, value_enum, ignore_case = true)]
    status: Option<StatusArg>,
    /// Only tasks of this type (PyTorchJob or RayJob).
    #[arg(long = "type", value_name = "TYPE")]
    task_type: Option<String>,
    /// Only tasks of this project group (or of any of several: a,b).
    #[arg(long)]
    group: Option<String>,
    /// Only tasks of this user.
    #[arg(long, value_name = "USER")]
    owner: Option<String>,
    /// Label selector: key=value[,key=value].
    #[arg(short = 'l', long)]
    labels: Option<String>,
    /// Search by name or ID.
    #[arg(short = 'q', long)]
    query: Option<String>,
    /// Only tasks that ask for GPUs (gpu), or only those that ask for none (cpu).
    #[arg(long, value_enum, ignore_case = true)]
    accelerator: Option<AcceleratorArg>,
}

impl TaskFilters {
    /// As the API's query parameters.
    pub fn pairs(self) -> Vec<(&'static str, Option<String>)> {
        vec![
            ("status", self.status.and_then(|s| s.to_possible_value()).map(|v| v.get_name().to_owned())),
            ("type", self.task_type),
            ("group", self.group),
            ("owner", self.owner),
            ("labels", self.labels),
            ("q", self.query),
            (
                "accelerator",
                self.accelerator.and_then(|a| a.to_possible_value()).map(|v| v.get_name().to_owned()),
            ),
        ]
    }
}

// Parsed once per run: the size of `Up`'s flags costs nothing worth boxing for.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start Trainyard on this machine: the store (SQLite in the data dir), the scheduler, the backend and the
    /// API, on 127.0.0.1:8080.
    Up {
        /// Where the store, the catalog and the bootstrap token live.
        #[arg(long, env = "TRAINYARD_DATA_DIR", default_value = ".trainyard")]
        data_dir: PathBuf,
        /// The address the API and the console listen on (`0.0.0.0:8080` for every interface; port 0 picks a
        /// free one).
        #[arg(long, default_value = DEFAULT_LISTEN)]
        listen: String,
        /// A PostgreSQL URL to use instead of the SQLite file.
        #[arg(long, env = "TRAINYARD_DATABASE_URL", hide_env_values = true)]
        database_url: Option<String>,
        /// What runs the replicas: `local` (sandboxed processes; needs bubblewrap), `kubernetes` (a cluster
        /// with the Kubeflow training operator and KubeRay; see --kubeconfig), `fake` (nothing runs; scripted
        /// durations), or `auto` (local when bubblewrap is installed).
        #[arg(long, env = "TRAINYARD_BACKEND", value_enum, default_value_t = up::BackendChoice::Auto)]
        backend: up::BackendChoice,
        /// On first start, split this machine into this many virtual nodes (CPUs, memory and GPUs shared out
        /// evenly), so gangs, fragmentation and node replacement happen for real on one box. At most one node
        /// per vCPU (and per GPU when there are GPUs); more is refused [default: 1].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        nodes: Option<u32>,
        /// A PEM file of extra CA certificates to trust for https alarm webhooks (a receiver with a private
        /// CA), beside the system's trust store.
        #[arg(long, env = "TRAINYARD_WEBHOOK_CA", value_name = "FILE")]
        webhook_ca: Option<PathBuf>,
        #[command(flatten)]
        sandbox: up::SandboxFlags,
        #[command(flatten)]
        server: up::ServerFlags,
        #[command(flatten)]
        kube: up::KubeFlags,
    },
    /// Runs one replica under supervision (started by the local backend; not for people).
    #[command(hide = true)]
    Supervise {
        /// The replica's run dir.
        dir: PathBuf,
    },
    /// Check task files against every rule and print their problems, or their resource demand.
    ///
    /// Exit status: 0 when every file is valid (warnings allowed), 1 when any file has errors, 2 when a
    /// file or the catalog cannot be read.
    Validate(ValidateArgs),
    /// Submit a task file (YAML or JSON; `-` for standard input).
    Submit {
        /// The task file (YAML or JSON); `-` reads standard input.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Send this directory with the task: every replica starts in a read-write copy of it at /workspace.
        /// Files its .gitignore files or a .trainyardignore list stay home, and so does .git; files the
        /// server already holds for the task's group are not sent again.
        #[arg(long, value_name = "DIR")]
        workdir: Option<PathBuf>,
        /// Makes a retried submission return the first task instead of creating a second one.
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        /// Follow the task until it ends: its events, and a status line with its place in the queue and the
        /// reason while it waits; exit 1 unless it succeeds.
        #[arg(long)]
        wait: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Run one command as a task: the current directory goes with it (every replica starts in a copy at
    /// /workspace), every replica's output is followed, and the exit status is the task's (its command's
    /// exit code when it failed with one). Ctrl-C leaves the task running.
    ///
    /// What it runs on comes from the options, else `defaults:` in the config file (group, pool, spec,
    /// image, resourceType), else the first quota line of your group whose spec fits (`--gpus`) and an image
    /// the group may use there.
    Run(RunArgs),
    /// List the tasks you can see, newest first.
    List {
        #[command(flatten)]
        filters: TaskFilters,
        /// newest (default), oldest, name or updated.
        #[arg(long)]
        sort: Option<String>,
        /// At most this many tasks (1 to 500).
        #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=500))]
        limit: u32,
        /// Output format (`wide`: with resource type, replicas, GPUs, run time and nodes).
        #[arg(short = 'o', long, value_enum, default_value_t = ListFormat::Table)]
        output: ListFormat,
        /// Keep watching: print the list again whenever it changes (asked every second), until Ctrl-C. With
        /// `-o json` one document per line.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// One task (by name or id).
    Get {
        /// The task's name or id.
        task: String,
        /// Output format (`wide`: with resource type, replicas, GPUs, run time and nodes).
        #[arg(short = 'o', long, value_enum, default_value_t = ListFormat::Table)]
        output: ListFormat,
        /// Keep watching: print the task again whenever it changes (asked every second), until it ends or
        /// Ctrl-C. With `-o json` one document per line.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// A task's details, placement and events.
    Describe {
        /// The task's name or id.
        task: String,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// A task's events.
    Events {
        /// The task's name or id.
        task: String,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// A replica's log: the master's (or the head's) of the latest attempt unless asked otherwise.
    Logs {
        /// The task's name or id.
        task: String,
        /// Follow the log until the replica ends.
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only the last N lines (then, with -f, what comes).
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
        /// The replica: its full name, or its role and index (`worker-1`, `head-0`).
        #[arg(long, conflicts_with = "all")]
        replica: Option<String>,
        /// Every replica of the attempt, each line prefixed with its replica's name.
        #[arg(long)]
        all: bool,
        /// The attempt (0 is the first) [default: the latest].
        #[arg(long)]
        attempt: Option<i64>,
        /// Put the time each line was written before it.
        #[arg(long)]
        timestamps: bool,
    },
    /// Stop a task (running ones get the checkpoint window first).
    Stop {
        /// The task's name or id.
        task: String,
        /// Follow the task until it is stopped (or ended otherwise), with a status line; exit 0 when it is
        /// stopped or succeeded first, 1 when it failed.
        #[arg(long)]
        wait: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Delete a task (stopping it first); its history is kept. Without TASK, every task you may operate that
    /// matches the filters (at least one) is deleted.
    Delete {
        /// The task's name or id; leave it out to delete by the filters below.
        task: Option<String>,
        /// With no TASK: which tasks.
        #[command(flatten)]
        filters: TaskFilters,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Run an ended task again, as a new attempt.
    Resubmit {
        /// The task's name or id.
        task: String,
        /// Follow the task until it runs again (or ends), with a status line that says its place in the
        /// queue and the reason while it waits; exit 0 when it runs or succeeded, 1 when it failed or was
        /// stopped.
        #[arg(long)]
        wait: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// A new task from another one's spec (a new name, queued, owned by you). Hidden variables are never
    /// copied: give each one's value with --hidden.
    Clone {
        /// The task's name or id.
        task: String,
        /// The project group the copy goes to [default: the original's]; it must be one of yours.
        #[arg(long)]
        group: Option<String>,
        /// The copy's name prefix [default: the original's].
        #[arg(long, value_name = "PREFIX")]
        name_prefix: Option<String>,
        /// A hidden variable's value for the copy, as NAME=VALUE (repeatable).
        #[arg(long = "hidden", value_name = "NAME=VALUE", value_parser = parse_pair)]
        hidden: Vec<(String, String)>,
        /// Follow the copy until it ends, as `submit --wait` does; exit 1 unless it succeeds.
        #[arg(long)]
        wait: bool,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Let another user see a task (and with --operate stop, resubmit, clone and delete it too), list whom it
    /// is shared with, or take a share back. Owners and admins; a user may also give back a share they were
    /// given (`--revoke` with their own name). The API shares with users, not groups.
    #[command(group = clap::ArgGroup::new("action").required(true).args(["with", "list", "revoke"]))]
    Share {
        /// The task's name or id.
        task: String,
        /// The user to share it with.
        #[arg(long = "with", value_name = "USER")]
        with: Option<String>,
        /// Let them operate it too, not only see it (with --with).
        #[arg(long, requires = "with")]
        operate: bool,
        /// List the users it is shared with, and whether each may operate it.
        #[arg(long)]
        list: bool,
        /// Take the share of this user back.
        #[arg(long, value_name = "USER")]
        revoke: Option<String>,
        /// Output format (with --list).
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// A task's metrics: each replica's preset resource metrics (CPU, memory, GPU) and the task's own, with
    /// the latest value, the smallest and the largest.
    Metrics {
        /// The task's name or id.
        task: String,
        /// Only this replica: its full name, or its role and index (`worker-1`, `head-0`).
        #[arg(long)]
        replica: Option<String>,
        /// The attempt (0 is the first) [default: the latest].
        #[arg(long)]
        attempt: Option<i64>,
        /// Output format (json and yaml: the API's answer, every sample).
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Who the token belongs to.
    Whoami,
    /// A completion script for your shell: `source <(trainyard completion bash)`, or write it where your shell
    /// loads completions from (`trainyard completion zsh > ~/.zfunc/_trainyard`, fish's
    /// `~/.config/fish/completions/trainyard.fish`).
    Completion {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Quotas of your groups (all for admins), what is left, and the pool's available, idle and unreserved
    /// capacity.
    Quota {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Working directories your groups hold (what `submit --workdir` and `run` sent), and fetching one.
    Workdir {
        #[command(subcommand)]
        command: WorkdirCommand,
    },
    /// Administration (admins only): the catalog, nodes, users and tokens.
    Admin {
        #[command(subcommand)]
        command: AdminCommand,
    },
}

#[derive(Debug, Subcommand)]
pub enum WorkdirCommand {
    /// The working directories of your groups (an admin's: every group's), the last used first.
    List {
        /// Only this project group's.
        #[arg(long)]
        group: Option<String>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Make a copy of a working directory in DIR (empty or new), every file checked against its digest.
    /// A replica on Kubernetes starts this way, with its attempt's token, before the task's command.
    Fetch {
        /// The working directory's id (as `list` shows it, or a task's spec.environment.workdir).
        id: String,
        /// The project group that holds it.
        #[arg(long)]
        group: String,
        /// Where to make it: a directory that is empty or does not exist yet.
        #[arg(long, value_name = "DIR")]
        into: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// The catalog: `get` it, or `set` it from a YAML or JSON file.
    Catalog {
        #[command(subcommand)]
        command: CatalogCommand,
    },
    /// Create or update a user; `--disable` refuses every token of theirs, holds their queued tasks and
    /// stops their running ones (their tasks stay; `--queued` and `--running` choose otherwise), `--enable`
    /// undoes it and releases the held tasks; `--delete` removes their tokens for good and retires the name
    /// (their tasks stay for the record; their work goes as for a disable).
    #[command(group = clap::ArgGroup::new("disabling").args(["disable", "delete"]))]
    User {
        /// The user's name.
        name: String,
        /// `member` or `admin`.
        #[arg(long, default_value = "member")]
        role: String,
        /// A project group the user belongs to (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Refuse every token of theirs from now on (their tasks stay).
        #[arg(long, conflicts_with_all = ["enable", "groups", "delete"])]
        disable: bool,
        /// Accept their tokens again.
        #[arg(long, conflicts_with_all = ["groups", "delete"])]
        enable: bool,
        /// Delete the user: their tokens are removed, the name is retired, their tasks stay for the record.
        #[arg(long, conflicts_with = "groups")]
        delete: bool,
        /// With --disable or --delete, what becomes of their queued tasks: `hold` them until enabled (the
        /// default), `stop` them, or `keep` them queued.
        #[arg(long, value_parser = ["hold", "stop", "keep"], requires = "disabling")]
        queued: Option<String>,
        /// With --disable or --delete, what becomes of their running tasks: `stop` them (the default; each
        /// gets the exit checkpoint notice first) or `keep` them running.
        #[arg(long, value_parser = ["stop", "keep"], requires = "disabling")]
        running: Option<String>,
    },
    /// A new API token for a user (printed once); `--list` shows their tokens' ids, `--revoke ID` revokes one.
    Token {
        /// The user the token is for.
        user: String,
        /// A note kept with the new token (what it is for).
        #[arg(long, default_value = "")]
        label: String,
        /// List the user's tokens (their ids and labels, never the tokens).
        #[arg(long, conflicts_with = "revoke")]
        list: bool,
        /// Revoke the token with this id (from --list).
        #[arg(long, value_name = "ID")]
        revoke: Option<String>,
    },
    /// The servers on this store: which one leads (runs the control loop, the scheduler and the backend),
    /// since when, with which fencing token, and every server seen lately.
    Server {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Registry logins for private images: `login`, `logout`, `list`.
    Registry {
        #[command(subcommand)]
        command: RegistryCommand,
    },
    /// Stop (`--cordon`) or resume (`--uncordon`) placing new work on a node; `--fail` marks it failed
    /// (its replicas are killed and fault tolerance takes over), `--repair` clears that.
    Node {
        /// The node's name in the catalog.
        name: String,
        /// Place no new work on it (what runs there goes on).
        #[arg(long, group = "node_action", required = true)]
        cordon: bool,
        /// Place new work on it again.
        #[arg(long, group = "node_action")]
        uncordon: bool,
        /// Mark it failed: its replicas are killed and fault tolerance takes over.
        #[arg(long, group = "node_action")]
        fail: bool,
        /// Clear the failed mark.
        #[arg(long, group = "node_action")]
        repair: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum RegistryCommand {
    /// Set the login Trainyard pulls a registry's images with (the password from standard input, so that it
    /// stays out of the shell's history and `ps`). It serves the catalog's image presets of that registry for
    /// the groups each is offered to, and any image of it for the groups named with `--group`; on Kubernetes
    /// it reaches the task's pods as their `imagePullSecrets`.
    Login {
        /// The registry's host (and port), as image references name it: `registry.example.com:5000`.
        host: String,
        /// The user name.
        #[arg(short = 'u', long)]
        username: String,
        /// Read the password from standard input (the only way it is given; the flag says so in scripts).
        #[arg(long, required = true)]
        password_stdin: bool,
        /// A project group whose tasks may pull any image of this registry with it (repeatable).
        #[arg(long = "group")]
        groups: Vec<String>,
    },
    /// Remove a registry's login.
    Logout {
        /// The registry's host (and port).
        host: String,
    },
    /// The registries with a login (never the passwords).
    List {
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
}

#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// Print the catalog in force.
    Get {
        /// Output format (`table` is YAML here too).
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Yaml)]
        output: Format,
    },
    /// Replace the catalog with the one in a file. One that takes away what active tasks use (their group,
    /// pool, instance spec, image, storage, or a node running their replicas) is refused, each conflict listed.
    Set {
        /// The catalog, in YAML or JSON.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Replace it even though active tasks use what it takes away.
        #[arg(long)]
        force: bool,
    },
}

/// Whether tasks ask for GPUs, as `list --accelerator` takes it (any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AcceleratorArg {
    Gpu,
    Cpu,
}

/// A task status, as `list --status` takes it (any case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "PascalCase")]
enum StatusArg {
    Queued,
    Admitted,
    Starting,
    Prechecking,
    Running,
    Stopping,
    Succeeded,
    Failed,
    Stopped,
}

#[derive(Debug, clap::Args)]
pub struct ValidateArgs {
    /// Task files in YAML or JSON; `-` reads standard input.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// The catalog (regions, clusters, pools, specs, images, storage, labels) to check references against.
    /// Without it: the server's catalog when a server answers (see --server, --token), else the example
    /// catalog built into this binary. Which one was used is said on standard error.
    #[arg(long, env = "TRAINYARD_CATALOG")]
    pub catalog: Option<PathBuf>,
    /// Do not ask a server for its catalog.
    #[arg(long)]
    pub offline: bool,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// For people: each file's problems, or its demand.
    Table,
    /// Every file's result, as JSON.
    Json,
}

/// `NAME=VALUE`.
fn parse_pair(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

/// `run`'s options (see [`Command::Run`]).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct RunArgs {
    /// The directory to send [default: the current one].
    #[arg(long, value_name = "DIR", conflicts_with = "no_workdir")]
    pub workdir: Option<PathBuf>,
    /// Send no directory.
    #[arg(long)]
    pub no_workdir: bool,
    /// The project group.
    #[arg(long)]
    pub group: Option<String>,
    /// The pool.
    #[arg(long)]
    pub pool: Option<String>,
    /// The instance spec.
    #[arg(long)]
    pub spec: Option<String>,
    /// The image (a catalog name or a reference).
    #[arg(long)]
    pub image: Option<String>,
    /// The resource type (Reserved, Ondemand, Spot, Idle).
    #[arg(long)]
    pub resource_type: Option<String>,
    /// Workers besides the master (or the Ray head).
    #[arg(long, default_value_t = 0)]
    pub workers: u32,
    /// GPUs a replica needs: the spec is the smallest that has them.
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// pytorch (a master and workers, each running the command) or ray (a head and workers; the command
    /// is the entrypoint).
    #[arg(long = "type", value_enum, default_value_t = RunType::Pytorch)]
    pub task_type: RunType,
    /// The task's name prefix [default: run].
    #[arg(long)]
    pub name_prefix: Option<String>,
    /// Print the task's name once it is submitted, and return.
    #[arg(short = 'd', long)]
    pub detach: bool,
    /// Resubmit it up to N times when an attempt fails for the platform's reasons (a node failed, it was
    /// preempted or disrupted), the output of each attempt followed in turn.
    #[arg(long, value_name = "N")]
    pub max_resubmissions: Option<u32>,
    /// The command and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// The kinds of task `run` makes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum RunType {
    #[default]
    Pytorch,
    Ray,
}
