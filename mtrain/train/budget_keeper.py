"""The trainer's one interface to its budgets: when training stops, and the time budget kept on
the way (the plan's arithmetic: mtrain.train.budget).

The loop calls, in this order:

- `start(state, resumed)` before the first update: under train.max_time, measure what follows
  training, plan the training share, say what the budget covers (or refuse a run that has no
  time left to train);
- `vote(state, update_seconds, updates_ahead)` when the ranks agree (mtrain.train.agreement:
  after every update in one process, every few seconds under DDP): this rank's view of the time
  budget; `seconds_to_deadline(state)` says when they should agree next;
- `stop_reason(state, update_seconds, agreed)` after each update: every budget and patience rule
  that ends training (`budget_reason`), the wall clock's included as agreed; a stop signal and
  the end of max_epochs, which are no budgets, stay with the loop;
- `measure(state)` when `measure_due` (agreed by the ranks): the end cost measured again and
  the training share planned again, off the training clock;
- `after_validation(state, seconds, replan)` (rank 0, before the checkpoint is written, as it
  saves the plan), `after_save(seconds)` (rank 0) and `after_pause(state, wall_seconds, replan)`
  (every rank, once a validation or save is over: the ranks agree on the plan).

With a `ShareMeter` (`watch`, mtrain fit on a CPU) it also says, once, when other processes
leave training much less than its threads' CPUs, and what that does to the budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from mtrain.config import TrainConfig
from mtrain.durations import format_duration
from mtrain.errors import MtrainError
from mtrain.machine_share import Share, ShareMeter
from mtrain.train.agreement import Ballot
from mtrain.train.budget import EndCost, RunBudget, budget_name, budget_reason
from mtrain.train.distributed import DistributedContext
from mtrain.train.progress import TrainState

log = logging.getLogger("mtrain")

# Training seconds before the machine's share is judged (the first updates build caches).
SHARE_AFTER_S = 10.0


class BudgetKeeper:
    def __init__(
        self,
        train_cfg: TrainConfig,
        dist: DistributedContext,
        run_budget: RunBudget,
        end_cost: Callable[[], EndCost] | None = None,
    ) -> None:
        """`run_budget` holds the run's clock; `end_cost`, run on rank 0 under train.max_time,
        measures what follows training (mtrain fit's: `fit_scoring.end_cost_estimate`)."""
        self.cfg = train_cfg
        self.dist = dist
        self.run = run_budget
        self.end_cost = end_cost
        self.measure_due = False  # the ranks agreed in `stop_reason`
        self._planned_done = False  # this rank's vote: the plan's end is near (`vote`)
        self.share: ShareMeter | None = None
        self.judged: Share | None = None  # the share once judged during training (logged when low)

    def watch(self, meter: ShareMeter) -> None:
        """Measure the machine's share of training with `meter` (rank 0's log says it when low)."""
        self.share = meter

    # ----------------------------------------------------------------- before the first update
    def start(self, state: TrainState, resumed: bool) -> None:
        """Under train.max_time, measure what follows training (rank 0) and plan the training
        time (a fresh run; a resumed one keeps its plan), then say what the budget covers."""
        run = self.run
        run.begin(state.train_seconds, state.wall_seconds)
        if run.max_seconds is not None:
            if self.dist.is_main and self.end_cost is not None:
                self._measure()
            if not resumed or state.train_budget_seconds is None:
                planned = run.plan(state.train_seconds) if self.dist.is_main else 0.0
                state.train_budget_seconds = self.dist.broadcast_from_main(planned or 0.0)
                if not resumed and state.train_budget_seconds <= 0.0:
                    raise MtrainError(self._no_time_to_train())
        line = self._budget_line(state, resumed)
        if line:
            log.info("%s", line)
        if self.share is not None:
            self.share.start()

    def _measure(self) -> None:
        assert self.end_cost is not None
        start = time.perf_counter()
        cost = self.end_cost()
        self.run.set_estimate(cost, time.perf_counter() - start)

    def _budget_line(self, state: TrainState, resumed: bool) -> str:
        """What the time budget covers, as the run starts."""
        run, planned = self.run, state.train_budget_seconds
        if run.max_seconds is None:
            if run.max_train_seconds is None:
                return ""
            return (
                f"budget: max_train_time={self.cfg.max_train_time} of training (the learning-rate schedule's "
                "horizon); validations, checkpoints and the test decode come on top (train.max_time caps the "
                "whole run)"
            )
        spent = run.wall_seconds()
        before = (
            f"{format_duration(spent)} spent before training (start-up, data, model, this estimate)"
            if not resumed
            else f"{format_duration(spent)} spent by its earlier sessions and this one's start"
        )
        kept = "nothing measured to keep for what follows"
        if run.cost is not None:
            kept = f"{format_duration(run.cost.total)} kept for what follows ({run.cost.describe()})"
        capped = budget_name(self.cfg, planned).startswith("max_train")
        share = (
            f"{format_duration(planned or 0.0)} of training"
            + (f" ({format_duration(state.train_seconds)} done)" if resumed else "")
            + " (the learning-rate schedule's horizon"
            + (f", capped by max_train_time={self.cfg.max_train_time}" if capped else "")
            + ")"
        )
        return f"budget: max_time={self.cfg.max_time} for the whole run: {before}, {share}, {kept}"

    def _no_time_to_train(self) -> str:
        cost = self.run.cost
        after = f" and what follows training is estimated at {cost.total:.0f} s ({cost.describe()})" if cost else ""
        return (
            f"train.max_time={self.cfg.max_time}: start-up and data preparation took "
            f"{self.run.wall_seconds():.0f} s{after}, which leaves no time to train; raise train.max_time, "
            "or leave out the test decode (data.splits.test=null) or shorten validation (train.valid_max_sentences=N)"
        )

    # ----------------------------------------------------------------- after each update
    def vote(self, state: TrainState, update_seconds: float, updates_ahead: int) -> tuple[bool, bool]:
        """This rank's view, for the ranks' agreement (mtrain.train.agreement): whether training
        must stop by time before the `updates_ahead` updates until the next agreement, and (rank 0)
        whether the end cost is due to be measured again. `update_seconds`: the last update's
        training time, the next ones' as the budget reads it."""
        planned = state.train_budget_seconds
        ahead_seconds = updates_ahead * update_seconds
        # Training ends nearest its plan: before updates that would end more than half past it
        # (a 7.6M model's update took 15 s on busy cores), and before ones the wall clock cannot afford.
        self._planned_done = planned is not None and state.train_seconds + ahead_seconds / 2 >= planned
        wall_short = self.run.must_stop(ahead_seconds)
        measure = self.dist.is_main and self.end_cost is not None and self.run.measure_due()
        return self._planned_done or wall_short, measure

    def seconds_to_deadline(self, state: TrainState) -> float | None:
        """Training seconds until the plan's end or the wall clock's (None: no time budget): the
        ranks agree again about then."""
        deadlines = []
        if state.train_budget_seconds is not None:
            deadlines.append(state.train_budget_seconds - state.train_seconds)
        wall_left, cost = self.run.seconds_left(), self.run.cost
        if wall_left is not None and cost is not None:
            deadlines.append(wall_left - cost.total)
        return min(deadlines) if deadlines else None

    def stop_reason(self, state: TrainState, update_seconds: float, agreed: Ballot) -> str | None:
        """Why training stops after this update (None: it goes on): max_updates, the planned
        training time, the wall clock under max_time, patience (`budget_reason`'s order).
        `agreed`: the ranks' agreement after this update (`NO_AGREEMENT` between agreements: the
        time budget is then not read, as it was agreed to last until the next one)."""
        out_of_time = agreed.out_of_time
        # Rank 0 holds the end cost: the ranks agree on its clock, as one rank past the budget stops them all.
        self.measure_due = agreed.measure and not out_of_time
        # Named while the plan is still the plan: _stop_by_time makes it what was trained (a few
        # seconds short of max_train_time=20m), which budget_name would read as max_time's share.
        planned = state.train_budget_seconds
        reason = budget_reason(state, self.cfg, out_of_time)
        if out_of_time:
            if (
                not self._planned_done
                and self.cfg.max_time is not None
                and reason == f"{budget_name(self.cfg, planned)} reached"
            ):
                reason = f"max_time={self.cfg.max_time} reached"  # the wall clock ended it before the plan
            self._stop_by_time(state, update_seconds, short=not self._planned_done)
        if self.share is not None:
            self.share.lap()
            self._judge_share(state)
        return reason

    def _stop_by_time(self, state: TrainState, update_seconds: float, short: bool) -> None:
        """Training ends by time: the plan becomes what was trained (a resume of the finished run
        finds it done); when the wall clock ran out before the plan (`short`), the log says why."""
        cost = self.run.cost
        if short and cost is not None:
            log.info(
                "%s: training stops at %s of the %s planned: another update (~%s) would leave less than "
                "the %s kept for what follows (%s)",
                budget_name(self.cfg, state.train_budget_seconds),
                format_duration(state.train_seconds),
                format_duration(state.train_budget_seconds or 0.0),
                format_duration(update_seconds),
                format_duration(cost.total),
                cost.describe(),
            )
        if state.train_budget_seconds is not None:
            state.train_budget_seconds = state.train_seconds

    # ----------------------------------------------------------------- off the training clock
    def measure(self, state: TrainState) -> None:
        """The end cost measured again (rank 0) and the training share planned again from it."""
        wall_start = time.perf_counter()
        if self.dist.is_main:
            before = self.run.cost
            self._measure()
            state.train_budget_seconds = self.run.plan(state.train_seconds)
            after = self.run.cost
            if before is not None and after is not None and abs(after.total - before.total) > 0.25 * before.total:
                log.info(
                    "budget: what follows training measured again (in %.1f s): %s (was %s); %s of training planned",
                    self.run.measure_seconds,
                    after.describe(),
                    before.describe(),
                    format_duration(state.train_budget_seconds or 0.0),
                )
        self.after_pause(state, time.perf_counter() - wall_start, replan=True)

    def after_validation(self, state: TrainState, seconds: float, replan: bool) -> None:
        """Rank 0's validation took `seconds`: the end cost is corrected, and with `replan` (a
        validation during training) the training time is planned again."""
        self.run.note_validation(seconds)
        if replan and self.run.max_seconds is not None:
            state.train_budget_seconds = self.run.plan(state.train_seconds)

    def after_save(self, seconds: float) -> None:
        self.run.note_save(seconds)

    def after_pause(self, state: TrainState, wall_seconds: float, replan: bool) -> None:
        """A validation, save or measurement took `wall_seconds` off the training clock; with
        `replan` every rank takes rank 0's plan."""
        if replan and self.run.max_seconds is not None:
            state.train_budget_seconds = self.dist.broadcast_from_main(state.train_budget_seconds or 0.0)
        self.run.note_overhead(wall_seconds)
        if self.share is not None:
            self.share.lap(count=False)

    # ----------------------------------------------------------------- the machine's share
    def _judge_share(self, state: TrainState) -> None:
        assert self.share is not None
        if self.judged is not None or self.share.wall_seconds < SHARE_AFTER_S or not self.dist.is_main:
            return
        self.judged = self.share.share()
        if self.judged.low:
            log.warning("%s", self.share_line(self.judged))

    def share_line(self, share: Share) -> str:
        """'other processes use this machine: this run got 53% of 2 CPUs; a 20-minute budget
        trains at most half as many updates as on an idle machine'."""
        if self.cfg.max_time is not None or self.cfg.max_train_time is not None:
            effect = f"a {budget_name(self.cfg, None)} budget trains at most {share.in_words()} as many updates as on an idle machine"
        else:
            effect = f"each update takes {1 / max(share.fraction, 1e-3):.1f}x as long as on an idle machine"
        return f"{share.describe('training')}; {effect}"

    def summary(self, state: TrainState) -> dict[str, object]:
        """For metrics.json: the training time planned, and the machine's share of training when watched."""
        planned = state.train_budget_seconds
        figures: dict[str, object] = {"train_budget_s": None if planned is None else round(planned, 2)}
        if self.share is not None and self.share.wall_seconds > 0:
            figures["machine_share"] = self.share.share().figures()
        return figures

    def share_summary(self) -> str | None:
        """The end-of-run line on the machine's share of training (None: not watched, or not low)."""
        if self.share is None or self.share.wall_seconds <= 0:
            return None
        share = self.share.share()
        if not share.low and (self.judged is None or not self.judged.low):
            return None
        return f"machine share over the whole training: {self.share_line(share)}"
