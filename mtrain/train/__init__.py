"""Training: loss, optimiser and schedule, checkpoints, the training loop, DDP."""
