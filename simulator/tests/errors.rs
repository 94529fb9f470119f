//! Bad input gives errors that name the field.

mod common;

use common::{pc, phone, phone_plan, workload};
use conductor_runtime::plan::{CoreSet, ExecutionPlan, PlacementError, ProfileError};
use conductor_runtime::quant::GgmlType;
use conductor_runtime::schedule::ScheduleError;
use conductor_runtime::trace::{ActiveSet, StepActivity};
use conductor_simulator::{describe_model_file, simulate, SimError, SimOptions, Workload};

fn err(
    profile: &conductor_runtime::plan::HardwareProfile,
    plan: &ExecutionPlan,
    w: &Workload,
) -> SimError {
    simulate(profile, plan, w, &SimOptions::lean()).expect_err("the simulation must refuse")
}

#[test]
fn missing_kernel_rates_name_the_class_and_type() {
    let mut p = pc();
    p.core_classes[0].kernels.retain(|k| k.ty != GgmlType::Q6_K);
    p.core_classes[0].name = "big".into();
    let e = err(&p, &ExecutionPlan::default(), &workload("llama-2-7b", 8, 1));
    assert_eq!(
        e.to_string(),
        "hardware profile core class `big` (core_classes[0].kernels) has no rates for Q6_K"
    );
    // The phone's little class lacks Q4_0: only groups that compute on it need it.
    let mut p = phone();
    p.core_classes[2].kernels.retain(|k| k.ty != GgmlType::Q4_0);
    simulate(
        &p,
        &phone_plan(),
        &workload("llama-2-7b", 8, 1),
        &SimOptions::lean(),
    )
    .expect("the little cores only drive the NPU");
    p.npu = None;
    let e = err(&p, &phone_plan(), &workload("llama-2-7b", 8, 1));
    assert!(
        matches!(
            &e,
            SimError::MissingRates { class, index: 2, ty: GgmlType::Q4_0 } if class == "little"
        ),
        "{e}"
    );
}

#[test]
fn plans_that_do_not_fit_the_machine_are_placement_errors() {
    let mut plan = ExecutionPlan::default();
    plan.groups[1].cores = CoreSet::Class("big".into());
    let e = err(&pc(), &plan, &workload("smollm2-135m", 8, 1));
    assert!(matches!(
        e,
        SimError::Placement(PlacementError::UnknownClass { .. })
    ));
    assert_eq!(
        e.to_string(),
        "plan field `groups[1].cores`: this machine has no core class `big` (classes: core)"
    );
    let mut w = workload("smollm2-135m", 8, 1);
    w.threads = Some(0);
    assert!(matches!(
        err(&pc(), &ExecutionPlan::default(), &w),
        SimError::Placement(PlacementError::ZeroThreads)
    ));
}

#[test]
fn bad_plans_and_shapes_are_schedule_errors() {
    let mut plan = ExecutionPlan::default();
    plan.prefill.output_rows = 0;
    let e = err(&pc(), &plan, &workload("smollm2-135m", 8, 1));
    assert!(matches!(e, SimError::Schedule(ScheduleError::Plan(_))));
    assert!(e.to_string().contains("prefill.output_rows"), "{e}");
    let mut w = workload("smollm2-135m", 8, 1);
    w.model.shape.n_head_kv = 0;
    let e = err(&pc(), &ExecutionPlan::default(), &w);
    assert!(matches!(
        e,
        SimError::Schedule(ScheduleError::EmptyShape("n_head_kv"))
    ));
}

#[test]
fn bad_profiles_name_the_field() {
    let mut p = pc();
    p.memory.bandwidth_gbs = 0.0;
    let e = err(
        &p,
        &ExecutionPlan::default(),
        &workload("smollm2-135m", 8, 1),
    );
    assert!(matches!(e, SimError::Profile(ProfileError::Field { .. })));
    assert!(e.to_string().contains("memory.bandwidth_gbs"), "{e}");
}

#[test]
fn bad_workloads_name_the_field() {
    let e = err(
        &pc(),
        &ExecutionPlan::default(),
        &workload("smollm2-135m", 0, 0),
    );
    assert!(
        e.to_string().starts_with("workload field `n_prompt`"),
        "{e}"
    );
    let mut w = workload("llama-2-7b", 0, 3);
    w.activity = Some(vec![StepActivity {
        step: 0,
        layers: vec![ActiveSet::All; 30],
    }]);
    let e = err(&pc(), &ExecutionPlan::default(), &w);
    assert_eq!(
        e.to_string(),
        "activity field `activity[0].layers`: lists 30 layers; the model `llama-2-7b` has 32"
    );
}

#[test]
fn a_model_file_that_cannot_be_read_is_named() {
    let e = describe_model_file(std::path::Path::new("/nonexistent/model.gguf")).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/model.gguf"), "{e}");
    assert!(matches!(e, SimError::Model { .. }));
}
