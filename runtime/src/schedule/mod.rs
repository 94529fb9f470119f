//! The scheduler: a pure state machine that turns events into neuron-cluster commands.
