//! `trainyard`: the one binary. `up` runs everything on this machine; the other verbs are the CLI, over the
//! HTTP API (`validate` works offline).

mod cli;
mod client;
mod conn;
mod logs;
mod machine;
mod metrics;
mod run;
mod table;
mod up;
mod validate;
mod wait;
mod watch;
mod workdir;

use clap::{CommandFactory, FromArgMatches};
use cli::{AdminCommand, CatalogCommand, Cli, Command, RegistryCommand, WorkdirCommand};
use client::Conn;
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc instead of the system allocator: under a stream of submissions the server's allocations
/// (request bodies, specs, the control loop's per-tick views) cost about a quarter less CPU and leave less
/// memory behind (api-bench: 176 against 229-255 µs of server CPU per create, same run).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The CLI's config file: where the server is and which token to use.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    server: Option<String>,
    token: Option<String>,
    /// What `trainyard run` runs on when its options do not say.
    defaults: Option<run::Defaults>,
}

fn config_file(path: Option<&std::path::Path>) -> Result<ConfigFile, String> {
    let default = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config/trainyard/config.yaml"));
    let explicit = path.is_some();
    let Some(path) = path.map(PathBuf::from).or(default) else { return Ok(ConfigFile::default()) };
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if explicit => Err(format!("cannot read {}: {e}", path.display())),
        Err(_) => Ok(ConfigFile::default()),
    }
}

/// Where `up` listens unless told otherwise, and where the CLI looks for a server.
const DEFAULT_LISTEN: &str = "127.0.0.1:8080";

/// The admin token `trainyard up` saves, where an `up` with the default data dir keeps it: in
/// `$TRAINYARD_DATA_DIR`, else in `.trainyard` under the current directory; as an absolute path.
fn default_token_file() -> Option<PathBuf> {
    let dir = std::env::var_os("TRAINYARD_DATA_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| PathBuf::from(".trainyard"), PathBuf::from);
    std::path::absolute(dir.join("admin.token")).ok()
}

fn main() -> ExitCode {
    let token_file = default_token_file();
    // The token's help names the file it would read here.
    let command = Cli::command().mut_arg("token", |a| match &token_file {
        Some(f) => a.help(format!(
            "API token [default: the config file's `token`, else the admin token `trainyard up` saved in its \
             data dir ($TRAINYARD_DATA_DIR, else .trainyard under the current directory): here {}]",
            f.display()
        )),
        None => a,
    });
    let cli = match Cli::from_arg_matches(&command.get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let config = match config_file(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("trainyard: {e}");
            return ExitCode::from(client::EXIT_USAGE);
        }
    };
    // An empty value (`TRAINYARD_TOKEN=` in a script, a blank `token:`) is no value: the next place is looked at.
    let given = |v: Option<String>| v.filter(|v| !v.trim().is_empty());
    let token = given(cli.token).or(given(config.token)).or_else(|| {
        token_file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()).map(|t| t.trim().to_owned())
    });
    let server =
        given(cli.server).or(given(config.server)).unwrap_or_else(|| format!("http://{DEFAULT_LISTEN}"));
    let conn = Conn { server, token, token_file };
    let by_name = |task: &str, then: &dyn Fn(&str) -> client::CallResult<ExitCode>| {
        client::finish(client::resolve(&conn, task).and_then(|id| then(&id)))
    };
    match cli.command {
        Command::Validate(args) => {
            validate::run(&args.files, args.catalog.as_deref(), &conn, args.offline, args.output)
        }
        Command::Supervise { dir } => ExitCode::from(trainyard_local::supervisor::main(&dir) as u8),
        Command::Up { data_dir, listen, database_url, backend, nodes, webhook_ca, sandbox, server, kube } => {
            let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("trainyard: cannot start the runtime: {e}");
                    return ExitCode::from(2);
                }
            };
            let opts = up::Options { backend, nodes, webhook_ca, sandbox, server, kube };
            match rt.block_on(up::run(&data_dir, &listen, database_url.as_deref(), &opts)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("trainyard: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Submit { file, workdir, idempotency_key, wait, output } => client::finish(client::submit(
            &conn,
            &file,
            workdir.as_deref(),
            idempotency_key.as_deref(),
            wait,
            output,
        )),
        Command::Run(args) => {
            client::finish(run::run(&conn, &args, &config.defaults.clone().unwrap_or_default()))
        }
        Command::List { filters, sort, limit, output, watch } => {
            let mut query = filters.pairs();
            query.extend([("sort", sort), ("limit", Some(limit.to_string()))]);
            client::finish(client::list(&conn, &query, output, watch))
        }
        Command::Get { task, output, watch } => by_name(&task, &|id| client::get(&conn, id, output, watch)),
        Command::Describe { task, output } => by_name(&task, &|id| client::describe(&conn, id, output)),
        Command::Events { task, output } => by_name(&task, &|id| client::events(&conn, id, output)),
        Command::Logs { task, follow, tail, replica, all, attempt, timestamps } => {
            let opts = logs::LogOpts { follow, tail, replica, all, attempt, timestamps };
            client::finish(logs::logs(&conn, &task, &opts))
        }
        Command::Stop { task, wait, output } => {
            by_name(&task, &|id| client::act(&conn, id, "stop", wait, output))
        }
        Command::Delete { task: Some(task), output, .. } => {
            by_name(&task, &|id| client::act(&conn, id, "delete", false, output))
        }
        Command::Delete { task: None, filters, output } => {
            client::finish(client::delete_matching(&conn, &filters.pairs(), output))
        }
        Command::Resubmit { task, wait, output } => {
            by_name(&task, &|id| client::act(&conn, id, "resubmit", wait, output))
        }
        Command::Clone { task, group, name_prefix, hidden, wait, output } => by_name(&task, &|id| {
            let to = client::CloneTo { group: group.as_deref(), name_prefix: name_prefix.as_deref() };
            client::clone(&conn, id, to, &hidden, wait, output)
        }),
        Command::Share { task, with: Some(with), operate, .. } => {
            by_name(&task, &|id| client::share(&conn, &task, id, &with, operate))
        }
        Command::Share { task, revoke: Some(user), .. } => {
            by_name(&task, &|id| client::unshare(&conn, &task, id, &user))
        }
        Command::Share { task, output, .. } => by_name(&task, &|id| client::shares(&conn, id, output)),
        Command::Metrics { task, replica, attempt, output } => {
            client::finish(metrics::metrics(&conn, &task, replica.as_deref(), attempt, output))
        }
        Command::Whoami => client::finish(client::whoami(&conn)),
        Command::Completion { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "trainyard", &mut out);
            client::outln!("{}", String::from_utf8_lossy(&out).trim_end());
            ExitCode::SUCCESS
        }
        Command::Quota { output } => client::finish(client::quota(&conn, output)),
        Command::Workdir { command: WorkdirCommand::List { group, output } } => {
            client::finish(workdir::list(&conn, group.as_deref(), output))
        }
        Command::Workdir { command: WorkdirCommand::Fetch { id, group, into } } => {
            client::finish(workdir::fetch(&conn, &id, &group, &into))
        }
        Command::Admin { command } => client::finish(match command {
            AdminCommand::Catalog { command: CatalogCommand::Get { output } } => {
                client::admin_catalog_get(&conn, output)
            }
            AdminCommand::Catalog { command: CatalogCommand::Set { file, force } } => {
                client::admin_catalog_set(&conn, &file, force)
            }
            AdminCommand::User { name, disable: true, queued, running, .. } => {
                client::admin_user_off(&conn, &name, "disable", queued.as_deref(), running.as_deref())
            }
            AdminCommand::User { name, delete: true, queued, running, .. } => {
                client::admin_user_off(&conn, &name, "delete", queued.as_deref(), running.as_deref())
            }
            AdminCommand::User { name, enable: true, .. } => client::admin_user_enable(&conn, &name),
            AdminCommand::User { name, role, groups, .. } => client::admin_user(&conn, &name, &role, &groups),
            AdminCommand::Token { user, list: true, .. } => client::admin_token_list(&conn, &user),
            AdminCommand::Token { user, revoke: Some(id), .. } => {
                client::admin_token_revoke(&conn, &user, &id)
            }
            AdminCommand::Token { user, label, .. } => client::admin_token(&conn, &user, &label),
            AdminCommand::Registry { command: RegistryCommand::Login { host, username, groups, .. } } => {
                client::admin_registry_login(&conn, &host, &username, &groups)
            }
            AdminCommand::Registry { command: RegistryCommand::Logout { host } } => {
                client::admin_registry_logout(&conn, &host)
            }
            AdminCommand::Server { output } => client::admin_server(&conn, output),
            AdminCommand::Registry { command: RegistryCommand::List { output } } => {
                client::admin_registry_list(&conn, output)
            }
            AdminCommand::Node { name, cordon, uncordon, fail, repair } => {
                let body = match (cordon, uncordon, fail, repair) {
                    (true, ..) => serde_json::json!({"schedulable": false}),
                    (_, true, ..) => serde_json::json!({"schedulable": true}),
                    (_, _, true, _) => serde_json::json!({"failed": true}),
                    _ => serde_json::json!({"failed": false}),
                };
                client::admin_node(&conn, &name, &body)
            }
        }),
    }
}
