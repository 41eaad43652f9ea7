"""Distributed layers: local kernels plus communication primitives; no MPI calls of their own."""
