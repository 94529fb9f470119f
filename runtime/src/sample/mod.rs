//! Sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty.
