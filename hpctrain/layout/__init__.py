"""Pure maths of where data sits on P ranks (no MPI; tested serially): block splits and halo
plans, tensor layouts on a Pr×Pc grid, and the moves between two layouts."""
