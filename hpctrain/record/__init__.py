"""What a run records: per-layer times of each step, a timeline of chosen steps, and the HDF5
run log."""
