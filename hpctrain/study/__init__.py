"""Studies from the cost model alone, no MPI and nothing run, each written to one HDF5 file: the
paper's Section 3 (strong, weak and domain scaling), flat against levelled planning, volumes under
a memory cap per rank, and the auto plan against PyTorch DDP's step."""
