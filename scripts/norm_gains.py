#!/usr/bin/env python
"""How far each layer's norms have moved from their initial gain of 1, and how alike they are.

For the claim "each sublayer needs its own LayerNorm" (docs/ABLATIONS.md §3): separate
norms can only matter once their learned gains differ. Prints, per run and layer, each
norm's gain mean and standard deviation over features, and the correlation between the
per-feature gains of the layer's norms (1.0 when they are one shared module).

    python scripts/norm_gains.py ablations/runs/standard runs/m30k --layers decoder.1
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.checkpoint.files import load_checkpoint
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", help="run directories")
    parser.add_argument("--checkpoint", default="last", help="last | best | update_N.pt")
    parser.add_argument(
        "--layers", default="decoder.1", help="comma-separated layer prefixes, e.g. encoder.0,decoder.1"
    )
    args = parser.parse_args()

    print("| run | layer | gain mean per norm | gain std per norm | correlation between norms |")
    print("|---|---|---|---|---|")
    for run in args.runs:
        try:
            state = load_checkpoint(RunDir(run).find_checkpoint(args.checkpoint))["model"]
        except MtrainError as error:
            sys.exit(f"norm_gains: {error}")
        for layer in [name.strip() for name in args.layers.split(",") if name.strip()]:
            gains = {
                name[len(layer) + 1 : -len("_norm.weight")]: tensor.float()
                for name, tensor in state.items()
                if name.startswith(layer + ".") and name.endswith("_norm.weight")
            }
            if not gains:
                sys.exit(f"norm_gains: {run}: no norms under {layer}")
            means = ", ".join(f"{name} {gain.mean():.3f}" for name, gain in gains.items())
            stds = ", ".join(f"{name} {gain.std():.3f}" for name, gain in gains.items())
            pairs = ", ".join(
                f"{a}/{b} {torch.corrcoef(torch.stack([gains[a], gains[b]]))[0, 1]:.2f}"
                for a, b in itertools.combinations(gains, 2)
            )
            print(f"| {Path(run).name} | {layer} | {means} | {stds} | {pairs} |")


if __name__ == "__main__":
    main()
