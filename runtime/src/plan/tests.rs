//! Unit tests of execution plans: validation, the plan file formats and hostile bincode.

use super::file::plan_bincode;
use super::*;

#[test]
fn default_plan_is_valid_and_round_trips_through_json_and_toml() {
    let plan = ExecutionPlan::default();
    plan.validate().unwrap();
    let json = serde_json::to_string(&plan).unwrap();
    let back: ExecutionPlan = serde_json::from_str(&json).unwrap();
    assert_eq!(plan, back);
    let toml = toml::to_string(&plan).unwrap();
    let back: ExecutionPlan = toml::from_str(&toml).unwrap();
    assert_eq!(plan, back);
}

/// A plan accepted is one JSON can write and read back: infinite or NaN thresholds and
/// predictions (JSON writes them as `null`) are refused naming the field; extreme finite
/// values (subnormals) come back exactly (both found by the fuzzer).
#[test]
fn plans_with_non_finite_numbers_are_refused_and_finite_ones_round_trip() {
    let refused = |f: &dyn Fn(&mut ExecutionPlan)| {
        let mut plan = ExecutionPlan::default();
        f(&mut plan);
        match plan.validate() {
            Err(PlanError::Parse(why)) => why,
            other => panic!("{other:?}"),
        }
    };
    let sparsity = |thresholds: Vec<f32>| SparsityPlan {
        mode: SparsityMode::Threshold,
        target: None,
        predictor_recall: None,
        thresholds,
    };
    let why = refused(&|p| p.sparsity = Some(sparsity(vec![0.5, f32::INFINITY])));
    assert!(why.contains("sparsity.thresholds[1]"), "{why}");
    let prediction = PlanPrediction {
        decode_tok_s: 2.7711982201388467e-302,
        prefill_tok_s: Some(f64::MIN_POSITIVE / 3.0),
        limited_by: "io".into(),
        profile: String::new(),
        reason: String::new(),
        bytes_per_token: None,
        compute_busy: None,
        storage_busy: Some(-2.436519963566265e289),
    };
    let why = refused(&|p| {
        p.predicted = Some(PlanPrediction {
            compute_busy: Some(f64::NAN),
            ..prediction.clone()
        })
    });
    assert!(why.contains("predicted.compute_busy"), "{why}");
    let mut plan = ExecutionPlan {
        sparsity: Some(sparsity(vec![f32::MIN_POSITIVE / 4.0, 2.3694278e-38])),
        predicted: Some(prediction),
        ..ExecutionPlan::default()
    };
    plan.validate().unwrap();
    let json = serde_json::to_string(&plan).unwrap();
    assert_eq!(serde_json::from_str::<ExecutionPlan>(&json).unwrap(), plan);
    plan.sparsity = None;
    plan.validate().unwrap();
}

/// Counts that would ask for unbounded threads or memory are refused naming the field;
/// the ceilings themselves are accepted.
#[test]
fn plans_asking_for_unbounded_threads_or_memory_are_refused() {
    let too_large = |f: &dyn Fn(&mut ExecutionPlan)| {
        let mut plan = ExecutionPlan::default();
        f(&mut plan);
        match plan.validate() {
            Err(PlanError::TooLarge { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        too_large(&|p| p.groups[1].threads = u32::MAX),
        "groups[1].threads"
    );
    assert_eq!(
        too_large(&|p| p.storage.io_threads = 1_000_000),
        "storage.io_threads"
    );
    assert_eq!(
        too_large(&|p| p.storage.queue_depth = u32::MAX),
        "storage.queue_depth"
    );
    assert_eq!(
        too_large(&|p| p.prefill_max_tokens = u32::MAX),
        "prefill_max_tokens"
    );
    assert_eq!(
        too_large(&|p| p.step_deadline_ms = u64::MAX),
        "step_deadline_ms"
    );
    assert_eq!(
        too_large(&|p| {
            p.cache = Some(CachePlan {
                slots: u32::MAX,
                ..CachePlan::default()
            })
        }),
        "cache.slots"
    );
    let mut plan = ExecutionPlan::default();
    plan.groups[0].threads = limits::THREADS;
    plan.storage.io_threads = limits::IO_THREADS;
    plan.validate().unwrap();
    plan.step_deadline_ms = 0;
    assert_eq!(
        plan.validate(),
        Err(PlanError::Zero {
            field: "step_deadline_ms".into()
        })
    );
}

#[test]
fn bad_plans_are_rejected_naming_the_field() {
    let mut plan = ExecutionPlan::default();
    plan.decode.ffn_neurons = 0;
    assert_eq!(
        plan.validate(),
        Err(PlanError::Zero {
            field: "decode.ffn_neurons".into()
        })
    );
    for version in [1, 99] {
        let plan = ExecutionPlan {
            version,
            ..ExecutionPlan::default()
        };
        assert!(matches!(plan.validate(), Err(PlanError::Version { .. })));
    }
    // Version 3 said gate-first loading with a flag; it reads as the read policy.
    let mut v3: serde_json::Value = serde_json::to_value(ExecutionPlan {
        cache: Some(CachePlan {
            slots: 8,
            ..CachePlan::default()
        }),
        ..ExecutionPlan::default()
    })
    .unwrap();
    v3["version"] = 3.into();
    let cache = v3["cache"].as_object_mut().unwrap();
    cache.remove("reads");
    cache.insert("gate_first".into(), true.into());
    let v3: ExecutionPlan = serde_json::from_value(v3).unwrap();
    v3.validate().unwrap();
    assert_eq!(v3.cache.unwrap().reads, ReadPolicy::GateFirst);
    // Version 4 names it, and it round-trips.
    let v4 = ExecutionPlan {
        cache: Some(CachePlan {
            reads: ReadPolicy::PredictedPages,
            ..CachePlan::default()
        }),
        ..ExecutionPlan::default()
    };
    let json = serde_json::to_string(&v4).unwrap();
    assert!(json.contains(r#""reads":"predicted-pages""#), "{json}");
    assert_eq!(serde_json::from_str::<ExecutionPlan>(&json).unwrap(), v4);
    // Version 2 (no budget, no sparsity of its own) still reads.
    let mut v2: serde_json::Value = serde_json::to_value(ExecutionPlan::default()).unwrap();
    v2["version"] = 2.into();
    let v2: ExecutionPlan = serde_json::from_value(v2).unwrap();
    v2.validate().unwrap();
    assert_eq!((v2.memory, v2.sparsity), (None, None));
    let plan = ExecutionPlan {
        memory: Some(0),
        ..ExecutionPlan::default()
    };
    assert_eq!(
        plan.validate(),
        Err(PlanError::Zero {
            field: "memory".into()
        })
    );
    let plan = ExecutionPlan {
        sparsity: Some(SparsityPlan {
            mode: SparsityMode::Threshold,
            target: Some(1.5),
            predictor_recall: None,
            thresholds: Vec::new(),
        }),
        ..ExecutionPlan::default()
    };
    assert!(plan
        .validate()
        .unwrap_err()
        .to_string()
        .contains("sparsity.target"));
    let plan = ExecutionPlan {
        sparsity: Some(SparsityPlan {
            mode: SparsityMode::Predictor,
            target: Some(0.3),
            predictor_recall: Some(0.0),
            thresholds: Vec::new(),
        }),
        ..ExecutionPlan::default()
    };
    assert!(plan
        .validate()
        .unwrap_err()
        .to_string()
        .contains("sparsity.predictor_recall"));

    let mut plan = ExecutionPlan::default();
    plan.prefill_on[0].group = "gpu".into();
    let err = plan.validate().unwrap_err();
    assert_eq!(
        err.to_string(),
        "plan field `prefill_on[0].group`: no group named `gpu` (groups: cpu, npu)"
    );

    let mut plan = ExecutionPlan::default();
    plan.groups[1].name = "cpu".into();
    assert!(matches!(
        plan.validate(),
        Err(PlanError::DuplicateGroup { field, .. }) if field == "groups[1].name"
    ));

    let mut plan = ExecutionPlan::default();
    plan.decode_on.push(plan.decode_on[0].clone());
    assert_eq!(
        plan.validate().unwrap_err().to_string(),
        "plan field `decode_on[1].group`: group `cpu` is named twice"
    );

    let mut plan = ExecutionPlan::default();
    plan.decode_on.clear();
    assert!(matches!(plan.validate(), Err(PlanError::NoGroups { .. })));
}

#[test]
fn plans_round_trip_through_json_toml_and_bincode_files() {
    let plan = ExecutionPlan {
        model: Some(ModelIdentity {
            arch: "llama".into(),
            n_layer: 30,
            n_embd: 576,
            n_ff: 1536,
            relu: false,
            norms_crc32: 0xdead_beef,
        }),
        predicted: Some(PlanPrediction {
            decode_tok_s: 12.5,
            prefill_tok_s: None,
            limited_by: "io".into(),
            profile: "this machine".into(),
            reason: "the disk".into(),
            bytes_per_token: Some(1e6),
            compute_busy: Some(0.5),
            storage_busy: Some(0.99),
        }),
        memory: Some(48 << 20),
        sparsity: Some(SparsityPlan {
            mode: SparsityMode::Threshold,
            target: Some(0.3),
            predictor_recall: Some(0.95),
            thresholds: vec![0.1, 0.2],
        }),
        ..ExecutionPlan::default()
    };
    let dir = std::env::temp_dir().join(format!("conductor-plan-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["p.json", "p.toml", "p.bin"] {
        let path = dir.join(name);
        plan.to_file(&path).unwrap();
        assert_eq!(ExecutionPlan::from_file(&path).unwrap(), plan, "{name}");
    }
    // A bincode plan named .json is not JSON: an error saying how to name it.
    std::fs::copy(dir.join("p.bin"), dir.join("q.json")).unwrap();
    let err = ExecutionPlan::from_file(&dir.join("q.json")).unwrap_err();
    assert!(err.to_string().contains("q.json"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_or_padded_bincode_plans_are_errors() {
    let bytes = bincode::serde::encode_to_vec(ExecutionPlan::default(), plan_bincode()).unwrap();
    for cut in 0..bytes.len() {
        assert!(
            ExecutionPlan::from_bincode(&bytes[..cut]).is_err(),
            "cut at {cut}"
        );
    }
    let mut padded = bytes.clone();
    padded.push(0);
    assert!(ExecutionPlan::from_bincode(&padded)
        .unwrap_err()
        .contains("1 bytes after"));
}

proptest::proptest! {
    /// Any bytes, and any single-byte change to a valid plan: a plan or an error, never a
    /// panic or an allocation beyond the limit.
    #[test]
    fn hostile_bincode_plans_never_panic(
        noise in proptest::collection::vec(proptest::num::u8::ANY, 0..512),
        at in 0usize..4096,
        byte in proptest::num::u8::ANY,
    ) {
        let _ = ExecutionPlan::from_bincode(&noise);
        let mut bytes =
            bincode::serde::encode_to_vec(ExecutionPlan::default(), plan_bincode()).unwrap();
        let i = at % bytes.len();
        bytes[i] = byte;
        if let Ok(plan) = ExecutionPlan::from_bincode(&bytes) {
            let _ = plan.validate();
        }
    }
}

#[test]
fn cores_are_a_class_name_or_a_list_of_ids() {
    let g: GroupPlan =
        serde_json::from_str(r#"{"name":"big","kind":"cpu","cores":[4,5,6,7]}"#).unwrap();
    assert_eq!(g.cores, CoreSet::Ids(vec![4, 5, 6, 7]));
    assert_eq!(g.threads, 0);
    let g: GroupPlan =
        serde_json::from_str(r#"{"name":"n","kind":"npu","cores":"little","threads":2}"#).unwrap();
    assert_eq!(g.cores, CoreSet::Class("little".into()));
}
