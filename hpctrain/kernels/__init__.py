"""Local compute on ``xp`` (NumPy or CuPy): no communication here."""
