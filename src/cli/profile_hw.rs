//! `conductor profile-hw`: measures this machine's hardware profile (TOML), the input of the
//! simulator and the planner. The measuring is `conductor_planner::hardware::measure`; this
//! file adds the detected topology, the measured messaging costs and the output.

use anyhow::{Context, Result};
use clap::Args;
use conductor_planner::hardware::{check_options, measure, MeasureOptions};
use std::path::PathBuf;

#[derive(Args)]
pub struct ProfileHwArgs {
    /// Write the profile to this file (default: print the TOML to stdout).
    #[arg(short = 'o', long = "out")]
    pub out: Option<PathBuf>,
    /// Fewer repetitions and smaller buffers: seconds instead of about a minute, noisier.
    #[arg(long)]
    pub quick: bool,
    /// Directory for the storage test file, written and removed (default: the temp directory).
    #[arg(long = "storage-dir")]
    pub storage_dir: Option<PathBuf>,
    /// Size of the storage test file in MiB (default: 1024, or 64 with --quick).
    #[arg(long = "storage-mb")]
    pub storage_mb: Option<u64>,
    /// Do not measure storage (the profile then holds placeholder storage figures, and says so).
    #[arg(long = "no-storage")]
    pub no_storage: bool,
}

pub fn run(args: ProfileHwArgs) -> Result<()> {
    let default_mb = if args.quick { 64 } else { 1024 };
    let opts = MeasureOptions {
        quick: args.quick,
        storage_dir: args.storage_dir.unwrap_or_else(std::env::temp_dir),
        storage_file_bytes: args
            .storage_mb
            .unwrap_or(default_mb)
            .saturating_mul(1 << 20),
        skip_storage: args.no_storage,
    };
    // Before the messaging measurement: a bad --storage-dir fails at once.
    check_options(&opts).context("profile-hw")?;
    let topology = conductor::actors::detect_topology();
    eprintln!("profile-hw: measuring messaging costs");
    let messaging = conductor::actors::measure_messaging();
    let profile = measure(&opts, &topology, messaging, &mut |line| eprintln!("{line}"))
        .context("profile-hw")?;
    let text = format!(
        "# Hardware profile of this machine, {}.\n# Regenerate with `conductor profile-hw{}`.\n\n{}",
        profile.source,
        if args.quick { " --quick" } else { "" },
        profile.to_toml()
    );
    match &args.out {
        Some(path) => {
            std::fs::write(path, &text)
                .with_context(|| format!("cannot write the profile to {}", path.display()))?;
            eprintln!("profile-hw: wrote {}", path.display());
        }
        None => print!("{text}"),
    }
    Ok(())
}
