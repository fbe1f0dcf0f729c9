"""The kit's algorithms inside other training libraries: `trl` (BPPO as a `GRPOTrainer`; needs the `trl` extra)."""
