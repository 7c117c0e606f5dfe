"""Training: loss, optimiser and schedule, checkpointing (the format: mtrain.checkpoint), the training loop, DDP."""
