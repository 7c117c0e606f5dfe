"""A two-rank gloo `mtrain fit` (torch.multiprocessing.spawn) that records, per update, what
the loop exchanges between ranks and reads on the host (tests/test_distributed.py,
tests/test_host_sync.py).

Collectives are counted by the process group's sequence number, which every collective on it
advances (DDP's bucket all-reduces, issued from C++, included). Host reads are counted as
tests/test_host_sync.py counts them: the Tensor methods that wait for the device.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import torch
import torch.distributed
import torch.multiprocessing

SYNCING = ["item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_two_ranks(overrides: list[str], run_dir: Path, agree_every_s: float) -> list[dict[str, Any]]:
    """Train `overrides` on two gloo ranks in `run_dir`, the ranks agreeing every `agree_every_s`
    training seconds; each rank's record (see `_probe`)."""
    port = free_port()
    torch.multiprocessing.spawn(_probe, args=(port, overrides, str(run_dir), agree_every_s), nprocs=2)
    return [json.loads((run_dir / f"probe{rank}.json").read_text()) for rank in range(2)]


def _probe(rank: int, port: int, overrides: list[str], run_dir: str, agree_every_s: float) -> None:
    """One rank: `iterations` is one row per update, {update, collectives: in the whole loop
    iteration that ran it (from one update's start to the next one's), in_update, in_agreement,
    agreed: whether the ranks agreed after it}; `host_reads` the syncing calls made while an
    update ran or its batches were prepared, as (phase, update, method)."""
    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from mtrain.cli.fit import run_fit
    from mtrain.train import agreement
    from mtrain.train.batch_source import BatchSource
    from mtrain.train.step import UpdateStep
    from mtrain.train.trainer import Trainer
    from tests.fit_runs import compose_fit

    agreement.AGREE_EVERY_S = agree_every_s
    rows: list[dict[str, Any]] = []
    host_reads: list[tuple[str, int, str]] = []
    phase: list[str] = []
    trainer_of: list[Trainer] = []

    def sequence() -> int:
        group = torch.distributed.distributed_c10d._get_default_group()
        return group._get_sequence_number_for_group()

    def counted_read(name: str, original: Any) -> Any:
        def method(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if phase and phase[-1] in ("update", "batches") and trainer_of:
                host_reads.append((phase[-1], trainer_of[0].state.update, name))
            return original(self, *args, **kwargs)

        return method

    for name in SYNCING:
        setattr(torch.Tensor, name, counted_read(name, getattr(torch.Tensor, name)))

    def in_phase(name: str, original: Any) -> Any:
        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            phase.append(name)
            try:
                return original(self, *args, **kwargs)
            finally:
                phase.pop()

        return method

    UpdateStep.__call__ = in_phase("update", UpdateStep.__call__)  # type: ignore[method-assign]
    BatchSource.next_update = in_phase("batches", BatchSource.next_update)  # type: ignore[method-assign]
    run_update, agree = Trainer.run_update, Trainer._agree

    def timed_update(self: Trainer) -> Any:
        if not trainer_of:
            trainer_of.append(self)
        start = sequence()
        if rows:  # the loop iteration of the update before ends where this one starts
            rows[-1]["collectives"] = start - rows[-1]["start"]
        stats = run_update(self)
        rows.append({"update": self.state.update, "start": start, "in_update": sequence() - start})
        return stats

    def timed_agreement(self: Trainer) -> Any:
        start, held = sequence(), self.agreement.held
        ballot = agree(self)
        if rows and rows[-1]["update"] == self.state.update:
            rows[-1].update(in_agreement=sequence() - start, agreed=self.agreement.held > held)
        return ballot

    Trainer.run_update = timed_update  # type: ignore[method-assign]
    Trainer._agree = timed_agreement  # type: ignore[method-assign]
    run_fit(compose_fit(overrides), Path(run_dir))
    rows = [row for row in rows if "collectives" in row]  # the last update's iteration ends with training
    record = {"iterations": rows, "host_reads": host_reads}
    (Path(run_dir) / f"probe{rank}.json").write_text(json.dumps(record))


def run_with_a_death(overrides: list[str], run_dir: Path, dying_rank: int, at_update: int) -> dict[str, Any]:
    """Train `overrides` on two gloo ranks until rank `dying_rank` is killed (SIGKILL) as update
    `at_update` begins; the survivor's record: {error: the MtrainError line it ended with (None:
    none), seconds: from the death to that error}."""
    port = free_port()
    context = torch.multiprocessing.start_processes(
        _dying, args=(port, overrides, str(run_dir), dying_rank, at_update), nprocs=2, join=False
    )
    for process in context.processes:  # (spawn's join would end the survivor as the other dies)
        process.join(timeout=240)
        if process.is_alive():
            process.kill()
    survivor = 1 - dying_rank
    return json.loads((run_dir / f"survivor{survivor}.json").read_text())


def _dying(rank: int, port: int, overrides: list[str], run_dir: str, dying_rank: int, at_update: int) -> None:
    import signal
    import time

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    from mtrain.cli.fit import run_fit
    from mtrain.errors import MtrainError
    from mtrain.train.trainer import Trainer
    from tests.fit_runs import compose_fit

    death = Path(run_dir) / "death"
    run_update = Trainer.run_update

    def mortal_update(self: Trainer) -> Any:
        if rank == dying_rank and self.state.update + 1 == at_update:
            death.write_text(str(time.monotonic()))
            os.kill(os.getpid(), signal.SIGKILL)
        return run_update(self)

    Trainer.run_update = mortal_update  # type: ignore[method-assign]
    error = None
    try:
        run_fit(compose_fit(overrides), Path(run_dir))
    except MtrainError as raised:
        error = str(raised)
    ended = time.monotonic()
    seconds = ended - float(death.read_text()) if death.exists() else None
    (Path(run_dir) / f"survivor{rank}.json").write_text(json.dumps({"error": error, "seconds": seconds}))
