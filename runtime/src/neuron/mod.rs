//! Neuron identities and neuron clusters: the unit of compute and I/O.
