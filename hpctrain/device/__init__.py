"""Where a rank computes: the array backend (NumPy on the CPU or CuPy on a GPU, and how its
arrays reach MPI), the clock its communication primitives report to, and threads per rank."""
