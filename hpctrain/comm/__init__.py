"""The only place that moves data with MPI: each primitive's backward is its forward's adjoint."""
