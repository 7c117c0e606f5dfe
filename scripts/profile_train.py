#!/usr/bin/env python
"""Where a training update's CPU time goes: torch.profiler over the trainer's own steps.

Prints the operators by self CPU time (share of the profiled time) for a config, after a
few warm-up updates, so that what lies outside the matrix products is visible.

    python scripts/profile_train.py experiment=multi30k_cpu --updates 30 --threads 2 --precision fp32
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.cli.common import CONFIG_DIR  # noqa: E402  (registers the config schemas)
from mtrain.batches import prepare_data  # noqa: E402
from mtrain.model import build_model  # noqa: E402
from mtrain.train.distributed import DistributedContext  # noqa: E402
from mtrain.train.runtime import resolve_device, resolve_precision, seed_everything  # noqa: E402
from mtrain.train.output_vocab import restrict_to_training_targets  # noqa: E402
from mtrain.train.trainer import Trainer, no_validation, special_ids  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the fit config")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--updates", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rows", type=int, default=30, help="operators to print")
    args = parser.parse_args()

    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="fit", overrides=args.overrides)
    torch.set_num_threads(args.threads or cfg.train.num_threads or torch.get_num_threads())
    device = resolve_device("cpu")
    precision = resolve_precision(args.precision, device)
    data = prepare_data(cfg.data, cfg.tokenizer, log=lambda *a: None)
    seed_everything(cfg.seed)
    model = build_model(cfg.model, data.tokenizer.src_vocab_size, data.tokenizer.tgt_vocab_size,
                        data.tokenizer.pad_id, joint_vocab=data.tokenizer.joint).to(device)
    restrict_to_training_targets(model, cfg.model.output_vocab, data.train, special_ids(data), data.tokenizer.unk_id)
    trainer = Trainer(cfg, model, data.train, special_ids(data), device, precision, DistributedContext(),
                      validate=no_validation)

    def update() -> int:
        batches = trainer.next_batches()
        trainer.set_learning_rate()
        stats = trainer.train_step(batches)
        trainer.state.update += 1
        return int(stats["tgt_tokens"])

    for _ in range(args.warmup):
        update()
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        tokens = sum(update() for _ in range(args.updates))
    events = profiler.key_averages()
    total = sum(event.self_cpu_time_total for event in events)
    print(f"# {precision}, {torch.get_num_threads()} threads, {args.updates} updates, {tokens} tgt tokens, "
          f"{tokens / (total / 1e6):.0f} tgt tok/s under the profiler")
    print(f"{'operator':<48} {'self %':>7} {'self ms/upd':>11} {'calls/upd':>9}")
    for event in sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.rows]:
        print(f"{event.key[:48]:<48} {100 * event.self_cpu_time_total / total:>6.1f}% "
              f"{event.self_cpu_time_total / 1e3 / args.updates:>11.1f} {event.count / args.updates:>9.1f}")


if __name__ == "__main__":
    main()
