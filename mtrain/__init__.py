"""mtrain: train, decode and evaluate Transformer translation models from one CLI."""

__version__ = "0.1.0"
