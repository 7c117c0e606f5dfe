"""One optimiser update, start to end: forward and backward over the update's batches,
gradient clipping, the step (skipped on the device when not finite); an update whose batches
run out of memory is skipped (`or_skip`).

Nothing in it waits for the device: the losses, the gradient norm and the non-finite flag
stay tensors until a log interval reads them (`tests/test_host_sync.py`). Under DDP nothing
waits for another rank either, besides DDP's own gradient reduction: the update's token count
over all ranks comes with the batches (`job_token_counts`; `tests/test_distributed.py`).
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from mtrain.batches import Batch
from mtrain.config import Precision
from mtrain.runtime import autocast
from mtrain.train.builders import TrainingParts
from mtrain.train.compilation import begin_graph_step
from mtrain.train.distributed import DistributedContext
from mtrain.train.faults import is_out_of_memory
from mtrain.train.instrument_log import InstrumentLog


class UpdateStep:
    """`step(batches, update)`: update number `update` over `batches` (gradient accumulation)."""

    def __init__(
        self, parts: TrainingParts, dist: DistributedContext, clip_norm: float, instruments: InstrumentLog
    ) -> None:
        self.parts = parts
        self.dist = dist
        self.clip_norm = clip_norm if clip_norm > 0 else float("inf")
        self.instruments = instruments

    def __call__(self, batches: list[Batch], update: int) -> dict[str, Any]:
        parts, optimizer = self.parts, self.parts.optimizer
        parts.network.train()
        optimizer.zero_grad(set_to_none=True)
        local_tokens = sum(batch.num_tgt_tokens for batch in batches)
        local_src_tokens = sum(batch.num_src_tokens for batch in batches)
        global_tokens, global_src_tokens = job_token_counts(batches, self.dist)
        # DDP averages gradients over ranks; scaling by world/global tokens makes the
        # result the gradient of the per-token mean over the whole update, as one process would.
        scale = self.dist.world_size / max(global_tokens, 1)
        loss_sum = torch.zeros((), device=parts.device)
        nll_sum = torch.zeros((), device=parts.device)
        for index, batch in enumerate(batches):
            last = index == len(batches) - 1
            # (with dist.enabled the network is a DistributedDataParallel, or compiled around one)
            sync = contextlib.nullcontext() if last or not self.dist.enabled else cast(DDP, parts.network).no_sync()
            with sync:
                loss, nll = self.forward_loss(batch)
                parts.scaler.scale(loss * scale).backward()
            loss_sum += loss.detach()
            nll_sum += nll
        parts.scaler.unscale_(optimizer)
        self.instruments.record(update)
        grad_norm = torch.nn.utils.clip_grad_norm_(parts.model.parameters(), self.clip_norm).detach()
        # A non-finite step must be skipped, not applied; the test stays on the device.
        skipped = torch.logical_not(torch.isfinite(grad_norm) & torch.isfinite(loss_sum))
        if parts.precision is Precision.fp16:
            parts.scaler.step(optimizer)  # the scaler skips overflowing steps itself
            parts.scaler.update()
            skipped = torch.zeros_like(skipped)  # and an overflow is not a fault
        else:
            self._step_unless(skipped)
        if parts.ema is not None:  # a skipped step left the weights as they were: the average goes on
            parts.ema.update(update)
        # Gradients are rebuilt by the next backward: validation and checkpoints run without them.
        optimizer.zero_grad(set_to_none=True)
        parts.non_finite.record(skipped)
        good = torch.logical_not(skipped)
        return {
            # a skipped update's NaN must not reach the logged averages
            "loss_sum": torch.where(good, loss_sum, 0.0),
            "nll_sum": torch.where(good, nll_sum, 0.0),
            "grad_norm": torch.where(good, grad_norm, 0.0),
            "skipped": skipped,
            "tgt_tokens": local_tokens,
            "src_tokens": local_src_tokens,
            "job_tgt_tokens": global_tokens,  # all ranks' (= the local counts in one process)
            "job_src_tokens": global_src_tokens,
            "sentences": sum(len(batch) for batch in batches),  # dummy rows (shape buckets) not counted
        }

    def or_skip(self, batches: list[Batch], update: int, max_tokens: int) -> dict[str, Any] | None:
        """The update, or None when its batches ran out of memory (skipped: the parts'
        `out_of_memory` guard counts them and gives up after too many in a row)."""
        try:
            stats = self(batches, update)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            self.parts.optimizer.zero_grad(set_to_none=True)
            shape = "x".join(str(s) for s in batches[0].tgt_input.shape)
            self.parts.out_of_memory.record_failure(shape, max_tokens)
            return None
        self.parts.out_of_memory.record_success()
        return stats

    def forward_loss(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Summed label-smoothed loss and NLL of one batch (a seam for fault-injection tests).
        Under CUDA graphs the token count is not passed: a graph is recorded per distinct input
        (the loss then weights the pad rows instead of selecting the others)."""
        graphs = self.parts.cuda_graphs
        if graphs:
            begin_graph_step()
        with autocast(self.parts.device, self.parts.precision):
            losses: tuple[torch.Tensor, torch.Tensor] = self.parts.network(
                batch.src_tokens,
                batch.src_padding_mask_or_none,  # None: no mask, flash-eligible attention
                batch.tgt_input,
                batch.tgt_output,
                None if graphs else batch.num_tgt_tokens,
                *(() if batch.alignment is None else (batch.alignment,)),  # guided alignment's targets
            )
        return losses

    def _step_unless(self, skipped: torch.Tensor) -> None:
        """optimizer.step(), skipped on the device when `skipped` is True.

        The fused AdamW (CPU and CUDA) takes a `found_inf` flag, as it does from GradScaler:
        it leaves weights and moments untouched and takes the step count back, with no host
        synchronisation. Another optimizer implementation reads the flag on the host.
        """
        optimizer = self.parts.optimizer
        if optimizer.defaults.get("fused"):
            # An attribute the fused kernels read but Optimizer does not declare (GradScaler sets it too).
            optimizer.found_inf = skipped.to(torch.float32)  # type: ignore[attr-defined]
            try:
                optimizer.step()
            finally:
                del optimizer.found_inf  # type: ignore[attr-defined]
        elif not bool(skipped):
            optimizer.step()


def job_token_counts(batches: list[Batch], dist: DistributedContext) -> tuple[int, int]:
    """The target and source tokens of the update over all ranks. Under DDP every rank knows
    them without a collective: each batch carries the counts of its position on every rank
    (`BatchSource`, as the sampler deals all ranks from one list)."""
    if dist.world_size <= 1:  # alone, or a group of one (torchrun with one process): the job is this rank
        return sum(batch.num_tgt_tokens for batch in batches), sum(batch.num_src_tokens for batch in batches)
    job_tgt = [batch.job_num_tgt_tokens for batch in batches]
    job_src = [batch.job_num_src_tokens for batch in batches]
    if any(count is None for count in job_tgt + job_src):
        raise RuntimeError("a DDP update's batches must carry the job's token counts (BatchSource sets them)")
    return sum(cast(list[int], job_tgt)), sum(cast(list[int], job_src))
