"""Errors a user can fix.

A :class:`UserError` is found from the command line, the net file and the number of processes
alone, so every rank raises the same one at the same point, before any rank can block: each rank
exits with status 2 and rank 0 prints the one-line message. Any other exception may have struck
one rank only, so the command line aborts the whole job instead (see :mod:`hpctrain.cli`).
"""

import argparse
from typing import NoReturn


class UserError(ValueError):
    """Bad input, detected identically on every rank; the message names the value and the fix."""


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose usage errors are :class:`UserError`.

    Under MPI every rank parses the command line; argparse's own handling would print the usage
    once per rank. As a UserError the message is printed once, by rank 0, and every rank exits
    with status 2.
    """

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see {self.prog} --help)")
