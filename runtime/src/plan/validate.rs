//! Checks of a plan before use: [`PlanError`], the fields a scheduler relies on, the ceilings
//! of [`limits`], and the model a plan was made for.

use super::{limits, ExecutionPlan, ModelIdentity, PLAN_FORMAT_VERSION, PLAN_FORMAT_VERSION_MIN};

/// A plan that cannot be used. Each error names the field.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    #[error("plan format version {found} is not supported (this build reads versions {min} to {expected})")]
    Version { found: u32, min: u32, expected: u32 },
    #[error("plan field `{field}` must be at least 1")]
    Zero { field: String },
    #[error("plan field `{field}` is {value}: at most {max}")]
    TooLarge { field: String, value: u64, max: u64 },
    #[error("plan field `{field}`: no group named `{name}` (groups: {known})")]
    UnknownGroup {
        field: String,
        name: String,
        known: String,
    },
    #[error("plan field `{field}`: group `{name}` is named twice")]
    DuplicateGroup { field: String, name: String },
    #[error("plan field `{field}` is empty: at least one group must compute these steps")]
    NoGroups { field: String },
    #[error("plan: {0}")]
    Parse(String),
    #[error("this plan was made for another model ({planned}); the model loaded is {actual}")]
    OtherModel { planned: String, actual: String },
}

impl ExecutionPlan {
    /// Refuses the plan when it was made for a model other than `model`.
    /// `actual`: the model's identity (`ModelIdentity::of`).
    pub fn check_model(&self, actual: &ModelIdentity) -> Result<(), PlanError> {
        let Some(planned) = &self.model else {
            return Ok(());
        };
        if planned == actual {
            Ok(())
        } else {
            Err(PlanError::OtherModel {
                planned: planned.describe(),
                actual: actual.describe(),
            })
        }
    }

    /// Checks the fields a scheduler relies on.
    pub fn validate(&self) -> Result<(), PlanError> {
        if !(PLAN_FORMAT_VERSION_MIN..=PLAN_FORMAT_VERSION).contains(&self.version) {
            return Err(PlanError::Version {
                found: self.version,
                min: PLAN_FORMAT_VERSION_MIN,
                expected: PLAN_FORMAT_VERSION,
            });
        }
        if self.memory == Some(0) {
            return Err(PlanError::Zero {
                field: "memory".into(),
            });
        }
        if let Some(t) = self.sparsity.as_ref().and_then(|s| s.target) {
            if !(0.0..=1.0).contains(&t) {
                return Err(PlanError::Parse(format!(
                    "plan field `sparsity.target` is {t}: a share within 0..=1"
                )));
            }
        }
        if let Some(r) = self.sparsity.as_ref().and_then(|s| s.predictor_recall) {
            if !(r > 0.0 && r <= 1.0) {
                return Err(PlanError::Parse(format!(
                    "plan field `sparsity.predictor_recall` is {r}: a share within (0, 1]"
                )));
            }
        }
        self.check_finite()?;
        let mut nonzero = vec![
            ("decode_max_tokens".to_string(), self.decode_max_tokens),
            ("prefill_max_tokens".to_string(), self.prefill_max_tokens),
            ("dense.token_chunk".to_string(), self.dense.token_chunk),
            ("storage.io_threads".to_string(), self.storage.io_threads),
            ("storage.queue_depth".to_string(), self.storage.queue_depth),
        ];
        for (name, s) in [("decode", &self.decode), ("prefill", &self.prefill)] {
            for (field, value) in [
                ("qkv_heads", s.qkv_heads),
                ("attn_heads", s.attn_heads),
                ("attn_out_rows", s.attn_out_rows),
                ("ffn_neurons", s.ffn_neurons),
                ("ffn_rows", s.ffn_rows),
                ("output_rows", s.output_rows),
            ] {
                nonzero.push((format!("{name}.{field}"), value));
            }
        }
        if let Some(c) = &self.cache {
            nonzero.push(("cache.slots".to_string(), c.slots));
            nonzero.push(("cache.max_loads".to_string(), c.max_loads));
        }
        for (field, value) in nonzero {
            if value == 0 {
                return Err(PlanError::Zero { field });
            }
        }
        if self.step_deadline_ms == 0 {
            return Err(PlanError::Zero {
                field: "step_deadline_ms".into(),
            });
        }
        self.check_ceilings()?;
        for (i, g) in self.groups.iter().enumerate() {
            if self.groups[..i].iter().any(|h| h.name == g.name) {
                return Err(PlanError::DuplicateGroup {
                    field: format!("groups[{i}].name"),
                    name: g.name.clone(),
                });
            }
        }
        for (field, shares) in [
            ("decode_on", &self.decode_on),
            ("prefill_on", &self.prefill_on),
        ] {
            if shares.is_empty() {
                return Err(PlanError::NoGroups {
                    field: field.into(),
                });
            }
            for (i, share) in shares.iter().enumerate() {
                if shares[..i].iter().any(|s| s.group == share.group) {
                    return Err(PlanError::DuplicateGroup {
                        field: format!("{field}[{i}].group"),
                        name: share.group.clone(),
                    });
                }
                self.group_index(&share.group)
                    .ok_or_else(|| PlanError::UnknownGroup {
                        field: format!("{field}[{i}].group"),
                        name: share.group.clone(),
                        known: self.group_names(),
                    })?;
                if share.weight == 0 {
                    return Err(PlanError::Zero {
                        field: format!("{field}[{i}].weight"),
                    });
                }
            }
        }
        Ok(())
    }

    /// Refuses infinite and NaN numbers: no threshold or prediction means one, and JSON, a
    /// plan's usual form, cannot write them (they would come back as `null` and fail to read).
    fn check_finite(&self) -> Result<(), PlanError> {
        let thresholds = self.sparsity.iter().flat_map(|s| {
            s.thresholds
                .iter()
                .enumerate()
                .map(|(i, &t)| (format!("sparsity.thresholds[{i}]"), f64::from(t)))
        });
        let predicted = self.predicted.iter().flat_map(|p| {
            [
                ("decode_tok_s", Some(p.decode_tok_s)),
                ("prefill_tok_s", p.prefill_tok_s),
                ("bytes_per_token", p.bytes_per_token),
                ("compute_busy", p.compute_busy),
                ("storage_busy", p.storage_busy),
            ]
            .into_iter()
            .filter_map(|(k, v)| Some((format!("predicted.{k}"), v?)))
        });
        match thresholds.chain(predicted).find(|(_, v)| !v.is_finite()) {
            Some((field, v)) => Err(PlanError::Parse(format!(
                "plan field `{field}` is {v}: a finite number"
            ))),
            None => Ok(()),
        }
    }

    /// Refuses counts that would ask for unbounded threads or memory ([`limits`]).
    fn check_ceilings(&self) -> Result<(), PlanError> {
        let mut ceilings: Vec<(String, u64, u64)> = vec![
            (
                "decode_max_tokens".into(),
                self.decode_max_tokens.into(),
                limits::STEP_TOKENS.into(),
            ),
            (
                "prefill_max_tokens".into(),
                self.prefill_max_tokens.into(),
                limits::STEP_TOKENS.into(),
            ),
            (
                "dense.token_chunk".into(),
                self.dense.token_chunk.into(),
                limits::STEP_TOKENS.into(),
            ),
            (
                "storage.io_threads".into(),
                self.storage.io_threads.into(),
                limits::IO_THREADS.into(),
            ),
            (
                "storage.queue_depth".into(),
                self.storage.queue_depth.into(),
                limits::QUEUE_DEPTH.into(),
            ),
            (
                "groups".into(),
                self.groups.len() as u64,
                limits::GROUPS as u64,
            ),
            (
                "step_deadline_ms".into(),
                self.step_deadline_ms,
                limits::DEADLINE_MS,
            ),
        ];
        for (i, g) in self.groups.iter().enumerate() {
            ceilings.push((
                format!("groups[{i}].threads"),
                g.threads.into(),
                limits::THREADS.into(),
            ));
        }
        if let Some(c) = &self.cache {
            for (field, value) in [
                ("slots", c.slots),
                ("hot_slots", c.hot_slots),
                ("max_loads", c.max_loads),
                ("coalesce", c.coalesce),
            ] {
                ceilings.push((format!("cache.{field}"), value.into(), limits::SLOTS.into()));
            }
        }
        for (field, value, max) in ceilings {
            if value > max {
                return Err(PlanError::TooLarge { field, value, max });
            }
        }
        Ok(())
    }

    /// The index (`XpuId`) of the group called `name`.
    pub fn group_index(&self, name: &str) -> Option<usize> {
        self.groups.iter().position(|g| g.name == name)
    }

    fn group_names(&self) -> String {
        let names: Vec<&str> = self.groups.iter().map(|g| g.name.as_str()).collect();
        names.join(", ")
    }
}
