//! `trainyard`: the command-line entry point.

mod validate;

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

/// Trainyard: submit and run PyTorchJob and RayJob training tasks.
#[derive(Debug, Parser)]
#[command(name = "trainyard", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check task files against every rule and print their problems, or their resource demand.
    ///
    /// Exit status: 0 when every file is valid (warnings allowed), 1 when any file has errors, 2 when a
    /// file or the catalog cannot be read.
    Validate(ValidateArgs),
}

#[derive(Debug, clap::Args)]
struct ValidateArgs {
    /// Task files in YAML or JSON; `-` reads standard input.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The catalog (regions, clusters, pools, specs, images, storage, labels) to check references against.
    /// Without it, the example catalog built into this binary is used.
    #[arg(long, env = "TRAINYARD_CATALOG")]
    catalog: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate(args) => validate::run(&args.files, args.catalog.as_deref(), args.output),
    }
}
