"""The only place that moves data between ranks (MPI, or NCCL on GPUs): each primitive's backward
is its forward's adjoint."""
