"""A training run: the network under its plan, the training loop, the optimizer and its
learning-rate schedule, checkpoints, and stop requests (SIGTERM, SIGUSR1)."""
