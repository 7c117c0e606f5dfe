"""When DDP ranks agree on stopping (mtrain.train.agreement): rarely under DDP, always alone."""

from __future__ import annotations

from mtrain.train.agreement import AGREE_EVERY_S, Agreement, Ballot
from mtrain.train.distributed import DistributedContext


def test_one_process_agrees_after_every_update_with_its_own_ballot():
    agreement = Agreement(DistributedContext())
    ballot = Ballot(stop_signal=True, validate=True)
    for update in range(1, 4):
        assert agreement.due(update)
        assert agreement.updates_ahead(update_seconds=0.01, seconds_to_deadline=None) == 1
        assert agreement.agree(ballot, update, ahead=1) is ballot
    assert agreement.held == 3


def test_under_ddp_the_next_agreement_is_about_two_seconds_of_updates_ahead():
    agreement = Agreement(DistributedContext(rank=0, world_size=2))
    assert agreement.due(0)  # before the first update: at once
    assert agreement.updates_ahead(update_seconds=0.0, seconds_to_deadline=None) == 1  # none timed yet
    assert agreement.updates_ahead(update_seconds=0.25, seconds_to_deadline=None) == int(AGREE_EVERY_S / 0.25)
    assert agreement.updates_ahead(update_seconds=5.0, seconds_to_deadline=None) == 1  # slow updates: each
    # the planned end of training 1 s away: the ranks agree again when it comes, not 2 s later
    assert agreement.updates_ahead(update_seconds=0.25, seconds_to_deadline=1.0) == 4
    assert agreement.updates_ahead(update_seconds=0.25, seconds_to_deadline=-3.0) == 1
    agreement.next_update = 12
    assert not agreement.due(11) and agreement.due(12)
