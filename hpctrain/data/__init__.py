"""Training data: synthetic batches drawn by global index, and HDF5 datasets read hyperslab by
hyperslab; each rank reads only its own block."""
