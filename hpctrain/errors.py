"""Errors a user can fix.

A :class:`UserError` is found from the command line, the net file and the number of processes
alone, so every rank raises the same one at the same point, before any rank can block: each rank
exits with status 2 and rank 0 prints the one-line message. Any other exception may have struck
one rank only, so the command line aborts the whole job instead (see :mod:`hpctrain.cli`).
"""


class UserError(ValueError):
    """Bad input, detected identically on every rank; the message names the value and the fix."""
