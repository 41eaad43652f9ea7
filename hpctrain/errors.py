"""Errors a user can fix.

A :class:`UserError` is found from the command line, the net file and the number of processes
alone, so every rank raises the same one at the same point, before any rank can block: each rank
exits with status 2 and rank 0 prints the one-line message. Any other exception may have struck
one rank only, so the command line aborts the whole job instead (see :mod:`hpctrain.cli`).

An :class:`OutputError` is a result that could not be written (disk full, permission taken
away): rank 0 writes, then tells every rank, so each exits with status 3.
"""

import argparse
from typing import NoReturn


class UserError(ValueError):
    """Bad input, detected identically on every rank; the message names the value and the fix."""


class OutputError(Exception):
    """A result (checkpoint, log, plan, profile, dataset) that could not be written; raised on
    every rank together, and the message names the file and the operating system's reason."""


EXIT_USER_ERROR = 2  # bad input
EXIT_OUTPUT_ERROR = 3  # a result could not be written


class ArgumentParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose usage errors are :class:`UserError`.

    Under MPI every rank parses the command line; argparse's own handling would print the usage
    once per rank. As a UserError the message is printed once, by rank 0, and every rank exits
    with status 2.
    """

    def error(self, message: str) -> NoReturn:
        raise UserError(f"{message} (see {self.prog} --help)")
