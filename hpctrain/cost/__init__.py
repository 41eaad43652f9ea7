"""Predicted cost of a plan: α–β communication, machine profiles, measured compute times."""
