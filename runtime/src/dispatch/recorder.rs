//! What a recording keeps: every event fed to the scheduler with its time and the commands it
//! produced, and the active neurons of each decode step (where a phase reported them; every
//! neuron elsewhere), which `conductor simulate --activity` replays.

use crate::schedule::{Activity, Command, Event, StepId, StepShape};
use crate::trace::{ActiveSet, StepActivity, TraceRecord};

/// What a recording kept.
#[derive(Default)]
pub struct Recording {
    pub records: Vec<TraceRecord>,
    pub activity: Vec<StepActivity>,
}

pub(super) struct Recorder {
    kept: Recording,
    n_layer: usize,
    /// The step in flight's active neurons, by layer.
    step_layers: Vec<ActiveSet>,
}

impl Recorder {
    pub fn new(n_layer: u32) -> Recorder {
        Recorder::with_capacity(n_layer, 0)
    }

    /// Sized up front for `events` records (a simulation knows how many it makes).
    pub fn with_capacity(n_layer: u32, events: usize) -> Recorder {
        Recorder {
            kept: Recording {
                records: Vec::with_capacity(events),
                activity: Vec::new(),
            },
            n_layer: n_layer as usize,
            step_layers: Vec::new(),
        }
    }

    pub fn record(&mut self, t_ns: u64, event: Event, commands: &[Command]) {
        self.kept.records.push(TraceRecord {
            t_ns,
            event,
            commands: commands.to_vec(),
        });
    }

    /// The active neurons a phase of `layer` reported.
    pub fn layer_activity(&mut self, layer: u32, activity: &Activity, scratch: &mut Vec<u32>) {
        self.step_layers.resize(self.n_layer, ActiveSet::All);
        let set = if activity.is_all() {
            ActiveSet::All
        } else {
            activity.union_into(scratch);
            ActiveSet::Neurons(scratch.clone())
        };
        if let Some(slot) = self.step_layers.get_mut(layer as usize) {
            *slot = set;
        }
    }

    pub fn step_done(&mut self, step: StepId, shape: StepShape) {
        let mut layers = std::mem::take(&mut self.step_layers);
        if shape == StepShape::Decode {
            layers.resize(self.n_layer, ActiveSet::All);
            self.kept.activity.push(StepActivity { step, layers });
        }
    }

    /// The step in flight failed: its activity is dropped.
    pub fn abort_step(&mut self) {
        self.step_layers.clear();
    }

    pub fn finish(self) -> Recording {
        self.kept
    }
}
