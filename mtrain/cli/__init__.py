"""Command-line entry points: one Hydra app per `mtrain` subcommand."""
