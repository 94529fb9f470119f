//! Plan files: JSON, TOML or bincode, chosen by the file's extension.

use super::{ExecutionPlan, PlanError};

/// Largest plan file read in bincode (plans are a few KiB; hot-neuron sets of big models
/// stay far below this).
const MAX_PLAN_BYTES: usize = 64 << 20;

pub(super) fn plan_bincode() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<MAX_PLAN_BYTES>()
}

/// How a plan file is written, by its extension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlanFormat {
    Json,
    Toml,
    Bincode,
}

impl PlanFormat {
    fn of(path: &std::path::Path) -> PlanFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some("toml") => PlanFormat::Toml,
            Some("bin") => PlanFormat::Bincode,
            _ => PlanFormat::Json,
        }
    }
}

impl ExecutionPlan {
    /// Reads a plan by the file's extension: bincode (`.bin`, for speed), TOML (`.toml`), or
    /// JSON (anything else; what `conductor plan` writes for people).
    pub fn from_file(path: &std::path::Path) -> Result<ExecutionPlan, PlanError> {
        let parse = |why: String| PlanError::Parse(format!("{}: {why}", path.display()));
        let bytes = std::fs::read(path)
            .map_err(|e| PlanError::Parse(format!("cannot read {}: {e}", path.display())))?;
        let plan: ExecutionPlan = match PlanFormat::of(path) {
            PlanFormat::Bincode => Self::from_bincode(&bytes).map_err(parse)?,
            PlanFormat::Toml | PlanFormat::Json => {
                let text = std::str::from_utf8(&bytes).map_err(|_| {
                    parse("not UTF-8 text (a bincode plan must end in .bin)".into())
                })?;
                if PlanFormat::of(path) == PlanFormat::Toml {
                    toml::from_str(text).map_err(|e| parse(e.to_string()))?
                } else {
                    serde_json::from_str(text).map_err(|e| parse(e.to_string()))?
                }
            }
        };
        plan.validate()?;
        Ok(plan)
    }

    /// Writes the plan in the format its extension names (as [`ExecutionPlan::from_file`]
    /// reads it).
    pub fn to_file(&self, path: &std::path::Path) -> std::io::Result<()> {
        let bytes = match PlanFormat::of(path) {
            PlanFormat::Bincode => bincode::serde::encode_to_vec(self, plan_bincode())
                .map_err(std::io::Error::other)?,
            PlanFormat::Toml => toml::to_string(self)
                .map_err(std::io::Error::other)?
                .into_bytes(),
            PlanFormat::Json => serde_json::to_string_pretty(self)?.into_bytes(),
        };
        std::fs::write(path, bytes)
    }

    /// A plan from bincode bytes (any bytes: an error, never a panic or a huge allocation).
    pub fn from_bincode(bytes: &[u8]) -> Result<ExecutionPlan, String> {
        let (plan, used): (ExecutionPlan, usize) =
            bincode::serde::decode_from_slice(bytes, plan_bincode()).map_err(|e| e.to_string())?;
        if used != bytes.len() {
            return Err(format!("{} bytes after the plan", bytes.len() - used));
        }
        Ok(plan)
    }
}
