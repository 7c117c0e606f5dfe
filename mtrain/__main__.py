"""`python -m mtrain CMD ...` (also what `torchrun -m mtrain fit ...` runs)."""

from mtrain.cli.main import main

main()
