"""What the DDP ranks must decide together between updates, settled in one collective now and then.

Each rank has its own view of what ends or interrupts training: a stop signal it received, its
clock against the time budget, validation or a checkpoint due by time; rank 0 alone knows when
the end cost is due to be measured again. Every rank must take the same branch after an update,
so the ranks agree, but an all-reduce read on the host drains the device's queue: under DDP they
agree only every `AGREE_EVERY_S` seconds of training (at least one update apart), in one
collective that also fixes when they agree next. The rules every rank reads alike from the
update count (max_updates, validate_every, patience) need no agreement and apply after every
update. In one process nothing is exchanged, and the ballot is counted after every update.
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass

from mtrain.train.distributed import DistributedContext

# How often, in training seconds, DDP ranks agree on stopping: a signal, a time budget or a
# validation due by time waits at most this long (a GPU update of ~0.3 s: every few updates).
AGREE_EVERY_S = 2.0


@dataclass(frozen=True)
class Ballot:
    """One rank's view after an update; agreed, each is True when it is True on any rank."""

    stop_signal: bool = False
    out_of_time: bool = False  # the training time planned, or the wall clock, allows no more updates
    measure: bool = False  # the end cost is due to be measured again (rank 0's clock)
    validate: bool = False  # train.validate_every_time has passed since the last validation
    save: bool = False  # train.save_every has passed since the last checkpoint (rank 0's checkpointer)


NO_AGREEMENT = Ballot()  # between agreements: nothing that needs one happens


class Agreement:
    """`due(update)`: whether the ranks agree after this update; `agree(ballot, update, ahead)`
    counts the ballots and fixes the next agreement `ahead` updates later (rank 0's choice)."""

    def __init__(self, dist: DistributedContext) -> None:
        self.dist = dist
        self.every_seconds = AGREE_EVERY_S
        self.next_update: int | None = None  # None: after the next update (and before the first)
        self.held = 0  # agreements so far (collectives under DDP)

    def due(self, update: int) -> bool:
        return not self.dist.enabled or self.next_update is None or update >= self.next_update

    def updates_ahead(self, update_seconds: float, seconds_to_deadline: float | None) -> int:
        """How many updates until the next agreement: about `every_seconds` of training at
        `update_seconds` per update, fewer so as to land near a deadline `seconds_to_deadline`
        away (the planned end of training); 1 in one process, or before an update is timed."""
        if not self.dist.enabled or update_seconds <= 0:
            return 1
        ahead = max(1, math.floor(self.every_seconds / update_seconds))
        if seconds_to_deadline is not None:
            ahead = min(ahead, max(1, round(seconds_to_deadline / update_seconds)))
        return ahead

    def agree(self, ballot: Ballot, update: int, ahead: int) -> Ballot:
        """Every rank's `ballot` counted (one all-reduce under DDP), and the next agreement set
        `ahead` updates after `update` as rank 0 counted them (the ranks' clocks differ a little)."""
        self.held += 1
        if not self.dist.enabled:
            self.next_update = update + ahead
            return ballot
        votes = [float(flag) for flag in astuple(ballot)] + [float(ahead) if self.dist.is_main else 0.0]
        counted = self.dist.sum_each(votes)  # the one host read: every rank must take the same branch now
        self.next_update = update + int(counted[-1])
        return Ballot(*(count > 0 for count in counted[:-1]))
