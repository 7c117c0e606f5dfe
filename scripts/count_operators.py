#!/usr/bin/env python
"""Leaf operators per training update, as a device sees them: what launches a kernel, what does not.

`torch.profiler` counts every operator event, including operators nested inside others (an
`aten::linear` and the `aten::t` and `aten::addmm` under it are three events). A
`TorchDispatchMode` sees each operator once, at the level where it reaches a device's kernels
(below autograd, after the composite operators have decomposed): that count is what a GPU's
host has to queue. Each operator is one of
- `view`: views and metadata (`view`, `t`, `transpose`, `slice`, `expand`, `detach`, `as_strided`,
  ...; `empty*` allocations): no kernel;
- `scalar read`: `_local_scalar_dense` (`.item()`, `bool(t)`): a host-device synchronisation;
- `kernel`: everything else, at least one kernel launch on a GPU (a few launch more).

Counted for mtrain's update (`Trainer.run_update`, built by `mtrain.train.setup` as `mtrain fit`
builds it) and for a bare reference loop of the same model on the same batches: forward to
logits (under the same autocast), `F.cross_entropy(label_smoothing=...)`, backward, foreach
AdamW (no clipping, no non-finite guard). `--cuda-paths` takes the branches mtrain takes on a GPU where they differ
from a CPU's (sdpa attention, `F.dropout`, one loss chunk per batch), so the counts are those a
GPU would be asked for; nothing here needs one.

    python scripts/count_operators.py model=transformer_base train.max_tokens=1024 --cuda-paths
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.cli.common import CONFIG_DIR
from mtrain.runtime import autocast
from mtrain.train.setup import setup_fit

KINDS = ("kernel", "view", "scalar read")
# No kernel, though not views by their schema: allocations and metadata.
NO_KERNEL = {
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::_unsafe_view",
    "aten::lift_fresh",
    "aten::set_",
    "aten::resize_",
    "aten::is_same_size",
    "aten::_has_compatible_shallow_copy_type",
    "aten::sym_size",
    "aten::sym_stride",
    "aten::sym_numel",
}


def kind_of(func: Any) -> str:
    name = func.name()  # "aten::add_.Tensor" -> its packet "aten::add_"
    packet = name.split(".")[0]
    if packet == "aten::_local_scalar_dense":
        return "scalar read"
    if func.is_view or packet in NO_KERNEL:
        return "view"
    return "kernel"


class OperatorCounter(TorchDispatchMode):
    """Counts each operator reaching the dispatcher's device level, by (kind, packet name)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.counts[(kind_of(func), func.name().split(".")[0])] += 1
        return func(*args, **(kwargs or {}))


def count(step: Callable[[], Any], updates: int) -> Counter:
    """Operators of `updates` calls of `step`, per update."""
    with OperatorCounter() as counter:
        for _ in range(updates):
            step()
    return Counter({key: value / updates for key, value in counter.counts.items()})


def take_cuda_paths() -> None:
    """The branches a GPU takes, on this CPU: `F.dropout` as CUDA runs it (`native_dropout`;
    mtrain's CPU dropout draws its mask its own way), one loss chunk per batch (a GPU's chunks
    are 16x a CPU's). sdpa attention is the config's `model.attention_impl=sdpa`."""
    import mtrain.model.dropout as dropout_module
    import mtrain.train.loss as loss_module

    def dropout(y: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        # what F.dropout runs on CUDA (on a CPU it decomposes into bernoulli_, div_ and mul)
        return torch.native_dropout(y, p, train=True)[0] if training and p > 0.0 else y

    def dropout_add(x: torch.Tensor, y: torch.Tensor, p: float, training: bool) -> torch.Tensor:
        return x + dropout(y, p, training)

    for name in ("attention", "embeddings", "feedforward", "layers", "variants"):
        module = sys.modules[f"mtrain.model.{name}"]
        for function in (dropout, dropout_add):
            if hasattr(module, function.__name__):
                setattr(module, function.__name__, function)
    dropout_module.dropout, dropout_module.dropout_add = dropout, dropout_add
    loss_module._CPU_CHUNK_ELEMENTS = loss_module._GPU_CHUNK_ELEMENTS


def bare_loop(setup: Any, label_smoothing: float) -> Callable[[], Any]:
    """One update of the reference loop on the trainer's next batches (the same model object)."""
    model, trainer = setup.model, setup.trainer
    pad = setup.data.tokenizer.special_ids.pad
    vocab = model.tgt_vocab_size
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)

    def update() -> None:
        batches = trainer.parts.batches.next_update(trainer.state)
        model.train()
        for batch in batches:
            with autocast(setup.machine.device, setup.machine.precision):
                logits = model(batch.src_tokens, batch.src_padding_mask, batch.tgt_input)[..., :vocab]
            loss = F.cross_entropy(
                logits.reshape(-1, vocab),
                batch.tgt_output.reshape(-1),
                ignore_index=pad,
                label_smoothing=label_smoothing,
                reduction="sum",
            )
            (loss / batch.num_tgt_tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return update


def report(title: str, counts: Counter, rows: int) -> dict[str, float]:
    totals = {kind: sum(v for (k, _), v in counts.items() if k == kind) for kind in KINDS}
    total = sum(totals.values())
    print(f"\n## {title}: {total:,.0f} operators per update")
    print(", ".join(f"{kind} {totals[kind]:,.0f}" for kind in KINDS))
    for kind in KINDS:
        top = sorted(((v, name) for (k, name), v in counts.items() if k == kind), reverse=True)[:rows]
        if top:
            print(f"  {kind}: " + ", ".join(f"{name.removeprefix('aten::')} {v:,.0f}" for v, name in top))
    return {"total": total, **totals}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the fit config")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--updates", type=int, default=2, help="counted updates (their mean is printed)")
    parser.add_argument("--warmup", type=int, default=1, help="updates before counting (the optimizer's state)")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--rows", type=int, default=8, help="operators named per kind")
    parser.add_argument("--cuda-paths", action="store_true", help="count the branches a GPU takes (see above)")
    parser.add_argument("--no-reference", action="store_true", help="count mtrain's update only")
    args = parser.parse_args()

    overrides = [*args.overrides, "train.device=cpu", f"train.precision={args.precision}"]
    if args.cuda_paths:
        overrides.append("model.attention_impl=sdpa")
        take_cuda_paths()
    if args.threads:
        overrides.append(f"train.num_threads={args.threads}")
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="fit", overrides=overrides)
    setup = setup_fit(cfg)
    trainer = setup.trainer
    print(
        f"# {cfg.model.encoder_layers}+{cfg.model.decoder_layers} layers, d_model {cfg.model.d_model}, "
        f"{setup.machine.precision}, max_tokens {cfg.train.max_tokens} x update_freq {cfg.train.update_freq}, "
        f"{'the CUDA branches' if args.cuda_paths else 'the CPU branches'}; mean of {args.updates} updates"
    )
    for _ in range(args.warmup):
        trainer.run_update()
    report("mtrain (Trainer.run_update)", count(trainer.run_update, args.updates), args.rows)
    if not args.no_reference:
        reference = bare_loop(setup, cfg.train.label_smoothing)
        for _ in range(args.warmup):
            reference()
        report("bare loop (forward, cross_entropy, backward, foreach AdamW)", count(reference, args.updates), args.rows)


if __name__ == "__main__":
    main()
