//! The `conductor` command line: run, fetch, check-refs, perplexity, bench.

mod cli;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cli::dispatch(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line, the whole cause chain: what users grep for.
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
