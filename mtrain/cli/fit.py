"""`mtrain fit`: raw parallel text -> tokenizer -> trained model -> test BLEU, in one run dir.

The run directory is Hydra's output directory. This module wires the stages together in
the order a reader would expect; each stage lives in its own package:

1. check everything that can refuse the run (run directory, resume, init_from's parent, data)
   -- nothing is written into the run directory before these checks pass;
2. prepare the data (tokenizer and encoded corpora live in the cache, not the run; with
   init_from the parent's tokenizer encodes it);
3. write the run's config, tokenizer, evaluation text and provenance.json (what ran: code, versions,
   command line, data fingerprints); build the model and trainer;
4. train (validation is `fit_scoring.validation`: loss, and BLEU through the evaluation path);
   write confidence.json, the confidence score's calibration, from the last validation's decodes;
5. score the test split through the same path as `mtrain eval` (`fit_scoring`), write metrics.json.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from mtrain.cli.common import mtrain_app
from mtrain.cli.fit_scoring import (
    ValidationDecodes,
    directions_of,
    log_test,
    score_test_split,
    split_name,
    validation,
    write_confidence,
)
from mtrain.cli.run_log import RunLog
from mtrain.config import FitConfig, with_resolved_model
from mtrain.config_checks import check_writable_dir, not_writable
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, RunLock, atomic_write_text

if TYPE_CHECKING:  # the heavy imports wait until a run starts (`mtrain fit --help` stays quick)
    from mtrain.batches import PreparedData
    from mtrain.cli.fit_scoring import ScoringDeadline
    from mtrain.train.budget import RunBudget
    from mtrain.train.init_from import Lineage, Parent

log = logging.getLogger("mtrain")
# The key that names the run directory in its refusals (as the config checks name it: mtrain.cli.common).
RUN_DIR_KEY = "hydra.run.dir"


def run_fit(
    cfg: FitConfig, run_dir: Path, command_line: Sequence[str] = (), started: float | None = None
) -> dict[str, Any]:
    """Train as `cfg` says (the dataclass, or its composed node), writing everything into
    `run_dir`; returns metrics.json's content. `command_line`: the overrides given (Hydra's
    task overrides), whose explicit model.* keys a run with init_from sets on its parent's model.
    `started`: when the command started (`time.monotonic()`; default now), which
    `train.max_time`, the whole run's wall time, counts from.

    The run directory has one writer: rank 0 holds its lock (`RunLock`) from before the
    first check to the end, and a second `mtrain fit` on it is refused. What is logged goes
    to the run's train.log only once every check has passed (`RunLog`).
    """
    started = time.monotonic() if started is None else started
    cfg = with_resolved_model(cfg)  # typed; config.yaml and the checkpoints record what is built
    run = RunDir(run_dir)
    with _claim(run) as run_log:
        return _check_and_fit(cfg, run, run_log, command_line, started)


@contextlib.contextmanager
def _claim(run: RunDir) -> Iterator[RunLog | None]:
    """Rank 0's hold on the run directory: its lock, and its log (held until the run is
    accepted). Other ranks of torchrun share the directory and claim nothing (None)."""
    from mtrain.train.distributed import launched_rank

    if launched_rank() != 0:
        yield None
        return
    with RunLog() as run_log:
        check_writable_dir(run.path, RUN_DIR_KEY)
        lock = RunLock(run)
        made_here = not run.path.exists()  # (the command's is made by Hydra: mtrain.cli.common removes it)
        try:
            run.path.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except OSError as error:  # what the check could not foresee (a full disk, a race)
            raise not_writable(run.path, RUN_DIR_KEY, error.strerror or str(error)) from error
        try:
            yield run_log
        except MtrainError:
            lock.release()
            if made_here:
                with contextlib.suppress(OSError):  # fails on a directory that is not empty
                    run.path.rmdir()  # refused before anything was written
            raise
        finally:
            lock.release()


def _check_and_fit(
    cfg: FitConfig, run: RunDir, run_log: RunLog | None, command_line: Sequence[str], started: float
) -> dict[str, Any]:
    """The checks of the run directory, of a resume's config and of init_from's parent, then `_fit`."""
    from mtrain.checkpoint.files import load_checkpoint
    from mtrain.train.budget import budget_reason
    from mtrain.train.checkpoint_state import resumed_budget
    from mtrain.train.checkpointer import (
        check_resumable_config,
        check_resumable_state,
        check_resumable_terms,
        is_finished,
    )
    from mtrain.train.faults import StopSignal
    from mtrain.train.init_from import inherited_config, load_parent, resumed_config
    from mtrain.train.progress import TrainState

    resume_path = _check_run_dir(run, cfg)
    resume_state = None
    if resume_path is not None:
        resume_state = load_checkpoint(resume_path, map_location="cpu")
        check_resumable_state(resume_state, resume_path)
    parent = None
    if resume_state is not None and resume_path is not None:  # a run started with init_from keeps its model
        cfg = resumed_config(cfg, resume_state, resume_path, command_line)
        check_resumable_config(resume_state, cfg, resume_path)
        check_resumable_terms(resume_state, cfg, resume_path)
    elif cfg.init_from is not None:
        parent = load_parent(cfg.init_from, cfg.init_weights, cfg.init_keep_optimizer, cfg.data, cfg.init_vocab)
        cfg = inherited_config(cfg, parent.config, command_line, f"init_from={cfg.init_from}")
        lineage = parent.lineage
        log.info(
            "init_from: %s (update %d, %s weights%s), its tokenizer and model (%s)",
            lineage["checkpoint"],
            lineage["update"],
            lineage["weights"],
            ", Adam's moments" if parent.optimizer is not None else "",
            " ".join(o for o in command_line if str(o).lstrip("+").startswith("model.")) or "as it was",
        )
        if "vocab" in lineage:
            log.info(
                "init_vocab=corpus: %d of the vocabulary's %d rows kept (the corpora's pieces, %s and the specials)",
                lineage["vocab"]["kept"],
                lineage["vocab"]["of"],
                " ".join(lineage["vocab"]["languages"]),
            )
    if resume_state is not None and is_finished(run.metrics_file):
        state = TrainState(**resume_state["trainer"])
        state.train_budget_seconds = resumed_budget(resume_state, cfg.train, state)
        done = budget_reason(state, cfg.train)
        if done is not None:
            finished = json.loads(run.metrics_file.read_text(encoding="utf-8"))
            log.info(
                "%s: this run has finished (%s, %s); nothing to do. Raise the budget "
                "(train.max_updates / train.max_time / train.max_train_time) to train on, or choose another "
                "hydra.run.dir",
                run.path,
                done,
                "test not scored within max_time: mtrain eval scores it"
                if "test_skipped" in finished
                else "test scored",
            )
            return finished

    # From here on SIGTERM/SIGINT stop at the next update boundary with a checkpoint.
    stop_signal = StopSignal()
    stop_signal.install()
    try:
        return _fit(cfg, run, resume_path, resume_state, stop_signal, run_log, started, parent, command_line)
    finally:
        stop_signal.uninstall()


def _fit(
    cfg: FitConfig,
    run: RunDir,
    resume_path: Path | None,
    resume_state: dict[str, Any] | None,
    stop_signal: Any,
    run_log: RunLog | None,
    started: float,
    parent: Parent | None = None,
    command_line: Sequence[str] = (),
) -> dict[str, Any]:
    """Prepare, write the run, train, test: `run_fit` once its checks have passed. With `parent`
    (init_from) its tokenizer encodes the data and its weights start the model; a resumed run that
    started so encodes with its own copy of that tokenizer. `command_line`: the overrides given,
    which provenance.json records."""
    import torch

    from mtrain.cli.fit_scoring import DecodeOutOfTime, end_cost_estimate
    from mtrain.durations import parse_duration
    from mtrain.evaluate.scoring import check_references
    from mtrain.machine_share import ShareMeter
    from mtrain.runtime import peak_host_memory_mb
    from mtrain.tokenizer import Tokenizer
    from mtrain.train.checkpointer import check_resumable_data, data_fingerprints
    from mtrain.train.distributed import init_distributed, shutdown_distributed
    from mtrain.train.faults import StopRequested, TrainingDiverged
    from mtrain.train.setup import build_fit, prepare_fit_data, resolve_machine

    lineage: Lineage | None = parent.lineage if parent is not None else None
    tokenizer = parent.tokenizer if parent is not None else None
    if resume_state is not None and resume_state.get("init"):
        lineage, tokenizer = resume_state["init"], Tokenizer.load(run.tokenizer_dir)
    elif resume_state is not None and cfg.tokenizer.path is not None:  # its own copy: the origin may be gone
        tokenizer = Tokenizer.load(run.tokenizer_dir)
    ddp_timeout = parse_duration(cfg.train.ddp_timeout, "train.ddp_timeout") or 1800.0  # checked: config
    machine = resolve_machine(cfg, init_distributed(cfg.train.device, ddp_timeout))
    dist, device = machine.dist, machine.device
    try:
        with stop_signal.interruptible("data preparation"):  # minutes at WMT scale: stop where it stands
            data = prepare_fit_data(cfg, machine, tokenizer=tokenizer)
    except StopRequested:
        raise _stopped(stop_signal, "the data preparation", "nothing was written into the run") from None
    for split in ("valid", "test") if data.test is not None else ("valid",):
        for direction in data.directions:
            check_references([getattr(direction, f"{split}_text").tgt], split_name(cfg, split, data, direction))
    if resume_state is not None and resume_path is not None:
        check_resumable_data(resume_state, data_fingerprints(data.fingerprint, data.tokenizer.fingerprint), resume_path)

    # Every check has passed: from here on the run directory is written.
    if run_log is not None:
        run_log.accept(run.log_file)
    if dist.is_main:
        log.info("run directory: %s", run.path.resolve())
        _write_run_files(run, cfg, data, lineage)
        _record_provenance(run, data, command_line, resume_path, resume_state)
    decodes = ValidationDecodes()  # the last validation's, for the confidence calibration
    setup = build_fit(
        cfg,
        machine,
        data,
        run=run,
        resume_state=resume_state,
        stop_signal=stop_signal,
        validation=lambda model, trained: validation(cfg, model, data, machine, trained, decodes),
        end_cost=lambda model, trained: end_cost_estimate(cfg, model, data, machine, trained),
        started=started,
        init=parent,
        lineage=lineage,
    )
    if resume_state is not None:
        log.info("resumed from %s", resume_path)
        del resume_state
    trainer, model = setup.trainer, setup.model
    if dist.is_main and device.type == "cpu":
        log.info("%s", _threads_line(cfg))
        trainer.budget.watch(ShareMeter(threads=torch.get_num_threads()))  # says when other jobs slow training

    metrics: dict[str, Any] = {
        "run_dir": str(run.path),
        "device": str(device),
        "precision": machine.precision,
        "data": data.summary,
    }  # per corpus: cleaning, train–test overlap, provenance
    if lineage:
        metrics["init"] = lineage
    try:
        try:
            # a rank that died or hung ends the job with one line, not a traceback
            with dist.watching_peers(lambda: f"training (update {trainer.state.update})"):
                metrics.update(trainer.fit())
        except TrainingDiverged:
            if dist.is_main:
                metrics.update(trainer.summary("diverged", diverged=True))
                atomic_write_text(run.metrics_file, json.dumps(metrics, indent=2, default=str) + "\n")
            raise
        trainer.release_training_memory()  # the test decode needs neither Adam's moments nor gradients
        if dist.is_main:
            write_confidence(run, decodes)
            if cfg.data.splits.test is not None:
                test_start = time.perf_counter()
                try:
                    with stop_signal.interruptible("test decode"):
                        metrics["test"] = score_test_split(
                            cfg,
                            run,
                            model,
                            data.tokenizer,
                            device,
                            machine.decode_precision,
                            directions_of(data),
                            scoring_deadline(cfg, trainer.budget.run),
                        )
                    log_test(trainer, metrics["test"])
                except StopRequested:
                    raise _stopped(
                        stop_signal,
                        "the test decode",
                        "the checkpoints are kept; train.resume=true scores the test split",
                    ) from None
                except DecodeOutOfTime as out_of_time:
                    metrics["test_skipped"] = out_of_time.line
                    log.warning(
                        "%s; score it with: mtrain eval run=%s split=test", out_of_time.line, run.path.resolve()
                    )
                metrics["test_time_s"] = round(time.perf_counter() - test_start, 2)
                test_peak = peak_host_memory_mb()
                if test_peak is not None:
                    metrics["peak_rss_mb"]["test"] = round(test_peak)
            if metrics["peak_rss_mb"]:
                log.info(
                    "peak host memory (RSS): %s",
                    " | ".join(f"{phase} {megabytes:,} MB" for phase, megabytes in metrics["peak_rss_mb"].items()),
                )
            metrics["finished"] = True
            metrics["wall_time_s"] = round(trainer.budget.run.wall_seconds(), 2)
            log.info("%s", wall_time_line(cfg, metrics, trainer.budget.run))
            share = trainer.budget.share_summary()
            if share is not None:
                log.warning("%s", share)
            metrics["disk_use_mb"] = run.disk_use_mb()
            log.info(
                "disk use of the run: %.1f MB, of which checkpoints %.1f MB",
                metrics["disk_use_mb"]["total"],
                metrics["disk_use_mb"]["checkpoints"],
            )
            atomic_write_text(run.metrics_file, json.dumps(metrics, indent=2, default=str) + "\n")
            log.info("%s", next_steps(run, has_test=cfg.data.splits.test is not None, directions=directions_of(data)))
    finally:
        if trainer.metrics is not None:
            trainer.metrics.close()
    with dist.watching_peers(lambda: "the wait for rank 0's test decode"):
        dist.barrier()
    shutdown_distributed(dist)
    return metrics


def wall_time_line(cfg: FitConfig, metrics: dict[str, Any], budget: Any) -> str:
    """How the run's wall time went, against train.max_time (and what was estimated for the
    end before training): 'wall time of the run: 1m58s of max_time=2m: training 1m21s, ...'."""
    from mtrain.durations import format_duration

    parts = [f"training {format_duration(metrics['train_time_s'])}"]
    parts.append(f"validation {format_duration(metrics.get('validation_time_s', 0.0))}")
    if "test_time_s" in metrics:
        stopped = " (stopped: max_time)" if "test_skipped" in metrics else ""
        parts.append(f"test decode {format_duration(metrics['test_time_s'])}{stopped}")
    against = f" of max_time={cfg.train.max_time}" if cfg.train.max_time is not None else ""
    estimate = f" (estimated before training: {budget.estimated.describe()})" if budget.estimated is not None else ""
    return f"wall time of the run: {format_duration(metrics['wall_time_s'])}{against}: {', '.join(parts)}{estimate}"


def scoring_deadline(cfg: FitConfig, budget: RunBudget) -> ScoringDeadline | None:
    """When the test decode must end under train.max_time (None: no max_time), and what was
    measured for it (the end cost as last measured during training)."""
    from mtrain.cli.fit_scoring import ScoringDeadline

    if budget.deadline is None or cfg.train.max_time is None:
        return None
    return ScoringDeadline(budget.deadline, budget.cost.test if budget.cost is not None else 0.0, cfg.train.max_time)


def _threads_line(cfg: FitConfig) -> str:
    """What a CPU run trains and decodes with: train.num_threads for the updates, and
    train.decode_num_threads (1 by default, as `mtrain eval`) for validation and the test."""
    import torch

    from mtrain.decode.engines.threads import DEFAULT_DECODE_THREADS, describe_threads

    training = describe_threads(torch.get_num_threads(), "train.num_threads", cfg.train.num_threads is not None)
    decoding = describe_threads(
        cfg.train.decode_num_threads or DEFAULT_DECODE_THREADS,
        "train.decode_num_threads",
        cfg.train.decode_num_threads is not None,
    )
    return f"training with {training}; validation and the test decode with {decoding}"


def _stopped(stop_signal: Any, phase: str, kept: str) -> Exception:
    """The one-line error of a stop signal outside training's updates (exit status 128 + signum)."""
    return stop_signal.interrupted(f"during {phase}; {kept}")


def next_steps(run: RunDir, has_test: bool = True, directions: Sequence[tuple[str, str]] = ()) -> str:
    """Where the run is and what to do with it next (printed when `mtrain fit` ends); without
    a test split (data.splits.test=null) the score line names the validation split. A
    multilingual run (several `directions`) names its first direction's languages."""
    path, split = run.path.resolve(), "test" if has_test else "valid"
    if len(directions) > 1:
        (src, tgt), report = directions[0], f"{split}.{directions[0][0]}-{directions[0][1]}"
        return (
            f"run directory: {path}\n"
            f"  translate:  mtrain translate run={path} tgt_lang={tgt} input=FILE output=FILE\n"
            f"  score:      mtrain eval run={path} src_lang={src} tgt_lang={tgt} split={split}    "
            f"(report: {run.eval_file(report, 'md').resolve()})\n"
            f"  curves:     tensorboard --logdir {run.tensorboard_dir.resolve()}"
        )
    return (
        f"run directory: {path}\n"
        f"  translate:  mtrain translate run={path} input=FILE output=FILE\n"
        f"  score:      mtrain eval run={path} split={split}    (report: {run.eval_file(split, 'md').resolve()})\n"
        f"  curves:     tensorboard --logdir {run.tensorboard_dir.resolve()}"
    )


def _check_run_dir(run: RunDir, cfg: FitConfig) -> Path | None:
    """Refuse a run directory that cannot be used as asked; the checkpoint to resume, if any."""
    check_writable_dir(run.path, RUN_DIR_KEY)  # (every rank: rank 0 alone writes, after `_claim`)
    if run.has_checkpoints() and cfg.init_from is not None:
        raise MtrainError(
            f"init_from={cfg.init_from}: {run.path} already has checkpoints; to continue that run, resume it with "
            "train.resume=true and without init_from (it keeps its parent's model and tokenizer); to start "
            "another run from init_from, choose a new hydra.run.dir (nothing was written)"
        )
    if run.has_checkpoints() and not cfg.train.resume:
        raise MtrainError(
            f"{run.path}: this run directory already has checkpoints; pass train.resume=true to "
            "continue it, or choose a new hydra.run.dir (nothing was overwritten)"
        )
    if not cfg.train.resume:
        return None
    if cfg.train.resume_from is not None:
        return run.find_checkpoint(cfg.train.resume_from)
    if not run.checkpoint("last").is_file():
        if cfg.init_from is None and run.parent_file.is_file():  # else it would start from scratch
            raise MtrainError(
                f"{run.path}: this run started from init_from={OmegaConf.select(OmegaConf.load(run.parent_file), 'from')} "
                f"({run.parent_file.name}) but has no checkpoint yet; start it again with that init_from= "
                "(nothing was written)"
            )
        log.warning("train.resume=true but %s has no checkpoint yet: starting from scratch", run.path)
        return None
    return run.checkpoint("last")


def _write_run_files(run: RunDir, cfg: FitConfig, data: PreparedData, lineage: Lineage | None = None) -> None:
    """The run's config (resolved, and Hydra's record of the command line), tokenizer and eval text;
    with init_from, the record of its parent beside config.yaml (parent.yaml)."""
    hydra_cfg = HydraConfig.get() if HydraConfig.initialized() else None
    if hydra_cfg is not None:  # Hydra's own writing is off (hydra.output_subdir=null): checks come first
        atomic_write_text(run.hydra_dir / "config.yaml", OmegaConf.to_yaml(cfg))
        atomic_write_text(run.hydra_dir / "hydra.yaml", OmegaConf.to_yaml({"hydra": hydra_cfg}))
        atomic_write_text(run.overrides_file, OmegaConf.to_yaml(list(hydra_cfg.overrides.task)))
    atomic_write_text(run.config_file, OmegaConf.to_yaml(cfg, resolve=True))
    if lineage:
        atomic_write_text(run.parent_file, OmegaConf.to_yaml(OmegaConf.create(lineage)))
    if any(path.parent.resolve() != run.tokenizer_dir.resolve() for path in data.tokenizer.files.values()):
        data.tokenizer.save(run.tokenizer_dir)  # (a resumed fine-tune encodes with the run's own copy)
    several = len(data.directions) > 1  # a multilingual run keeps each direction's text
    for split in ("valid", "test") if data.test is not None else ("valid",):
        for direction in data.directions:
            text = getattr(direction, f"{split}_text")
            src_path, ref_path = run.split_files(split, direction.name if several else None)
            atomic_write_text(src_path, "".join(line + "\n" for line in text.src))
            atomic_write_text(ref_path, "".join(line + "\n" for line in text.tgt))


def _record_provenance(
    run: RunDir,
    data: PreparedData,
    command_line: Sequence[str],
    resume_path: Path | None,
    resume_state: dict[str, Any] | None,
) -> None:
    """This session's entry in the run's provenance.json (mtrain.provenance), said in the log."""
    from mtrain import provenance
    from mtrain.train.checkpointer import data_fingerprints

    caches = {
        # The cache entries read (named by their fingerprints; a resume may find them rebuilt).
        "training_corpora": [
            str(part.corpus.directory.parent) for part in data.train_parts if part.corpus.directory is not None
        ],
        "tokenizer": sorted({str(path.parent) for path in data.tokenizer.files.values()}),
    }
    sampled = sorted({str(copy.directory.parent) for copy in data.train_copies if copy.directory is not None})
    if sampled:  # data.subword_sampling's segmentations
        caches["sampled_copies"] = sampled
    record = provenance.session_record(
        command_line,
        {"fingerprints": data_fingerprints(data.fingerprint, data.tokenizer.fingerprint), "caches": caches},
        resumed_from=str(resume_path) if resume_path is not None else None,
        update=int(resume_state["trainer"]["update"]) if resume_state is not None else 0,
    )
    provenance.append_session(run.provenance_file, record)
    log.info("%s (%s)", provenance.describe(record), run.provenance_file.name)


@mtrain_app("fit")
def main(cfg: FitConfig) -> None:
    from hydra.types import RunMode

    from mtrain.runtime import process_started

    hydra_cfg = HydraConfig.get()
    # train.max_time counts from the command's start (Python's own included); a sweep's job, from its own.
    started = process_started() if hydra_cfg.mode == RunMode.RUN else None
    run_fit(cfg, Path(hydra_cfg.runtime.output_dir), command_line=list(hydra_cfg.overrides.task), started=started)
