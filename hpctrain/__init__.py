"""hpctrain: integrated model, batch and domain (1.5D) parallel training on MPI."""

__version__ = "0.1.0"
