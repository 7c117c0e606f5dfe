#!/usr/bin/env python
"""Where a training update's CPU time goes: torch.profiler over the trainer's own updates
(`Trainer.run_update`, built by `mtrain.train.setup` as `mtrain fit` builds it).

Prints the operators by self CPU time (share of the profiled time) for a config, after a
few warm-up updates, so that what lies outside the matrix products is visible.

    python scripts/profile_train.py experiment=multi30k_cpu --updates 30 --threads 2 --precision fp32
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.cli.common import CONFIG_DIR
from mtrain.train.setup import setup_fit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the fit config")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rows", type=int, default=30, help="operators to print")
    parser.add_argument(
        "--copies",
        action="store_true",
        help="also: where the aten::copy_ calls come from (their three nearest callers)",
    )
    args = parser.parse_args()

    overrides = [*args.overrides, "train.device=cpu", f"train.precision={args.precision}"]
    if args.threads:
        overrides.append(f"train.num_threads={args.threads}")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="fit", overrides=overrides)
    setup = setup_fit(cfg)
    trainer, precision = setup.trainer, setup.machine.precision

    def update() -> int:
        stats = trainer.run_update()
        return 0 if stats is None else int(stats["tgt_tokens"])

    for _ in range(args.warmup):
        update()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=args.copies) as profiler:
        tokens = sum(update() for _ in range(args.updates))
    events = profiler.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    print(
        f"# {precision}, {torch.get_num_threads()} threads, {args.updates} updates, {tokens} tgt tokens, "
        f"{tokens / (total / 1e6):.0f} tgt tok/s under the profiler"
    )
    print(f"# {sum(event.count for event in events) / args.updates:.1f} operators dispatched per update")
    print(f"{'operator':<48} {'self %':>7} {'self ms/upd':>11} {'calls/upd':>9}")
    for event in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[: args.rows]:
        print(
            f"{event.key[:48]:<48} {100 * event.self_cpu_time_total / total:>6.1f}% "
            f"{event.self_cpu_time_total / 1e3 / args.updates:>11.1f} {event.count / args.updates:>9.1f}"
        )
    if args.copies:
        print_copy_callers(profiler, args.updates, args.rows)


def print_copy_callers(profiler, updates: int, rows: int) -> None:
    """aten::copy_ per update by its callers (casts, layout changes, ...): what a GPU pays too."""
    callers: Counter = Counter()
    for event in profiler.events():
        if event.name != "aten::copy_":
            continue
        chain, parent = [], event.cpu_parent
        while parent is not None and len(chain) < 3:
            chain.append(parent.name)
            parent = parent.cpu_parent
        first_input = str(event.input_shapes[0]) if event.input_shapes else "?"
        callers[(" <- ".join(chain) or "(top level)", "scalar" if first_input == "[]" else "tensor")] += 1
    print(f"{'copy_/upd':>9}  {'of':<6}  callers")
    for (chain, kind), count in callers.most_common(rows):
        print(f"{count / updates:>9.1f}  {kind:<6}  {chain}")


if __name__ == "__main__":
    main()
