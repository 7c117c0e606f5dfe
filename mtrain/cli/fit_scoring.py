"""How `mtrain fit` scores its model: the trainer's validation callable (loss, perplexity and
BLEU, per direction for a multilingual run, their mean for best.pt) and the test decode at the
end of the run, through the evaluation path of `mtrain eval`, with its log lines.

Under train.max_time the test decode keeps to the run's deadline (`ScoringDeadline`): it is not
started when what was measured for it clearly cannot fit in the time left, and it stops before
a batch that would end past the deadline (batches come longest first, so the next one is about
as long as the last or shorter). Either way no score is reported (a part of the split, its
longest sentences, would not compare with any other score) and the log says how to score it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtrain.config import Engine, FitConfig, Precision, to_plain, with_values
from mtrain.durations import format_duration, parse_duration
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir
from mtrain.wording import counted

if TYPE_CHECKING:  # the heavy imports wait until a run starts (`mtrain fit --help` stays quick)
    import torch

    from mtrain.batches import PreparedData
    from mtrain.decode.text.progress import DecodeProgress
    from mtrain.tokenizer import Tokenizer
    from mtrain.train.budget import EndCost
    from mtrain.train.setup import Machine

log = logging.getLogger("mtrain")


def directions_of(data: PreparedData) -> list[tuple[str, str]]:
    """The directions a run trains, as preparation found them (one for a bilingual run)."""
    return [(direction.src, direction.tgt) for direction in data.directions]


def split_name(cfg: FitConfig, split: str, data: PreparedData, direction: Any) -> str:
    """How errors name a split: `data.splits.valid=val`, with the direction when there are several."""
    name = split_name_of(cfg, split)
    return f"{name} ({direction.name})" if len(data.directions) > 1 else name


def split_name_of(cfg: FitConfig, split: str) -> str:
    """`data.splits.test=test_2016_flickr`."""
    return f"data.splits.{split}={getattr(cfg.data.splits, split)}"


def log_interval(cfg: FitConfig) -> float | None:
    """Seconds between progress lines of a decode (train.log_every_time; None: none)."""
    return parse_duration(cfg.train.log_every_time, "train.log_every_time")


@dataclass
class ValidationDecodes:
    """The last validation's best hypotheses (every direction's), kept for the confidence
    calibration `write_confidence` fits: per sentence the signal (None: a blank source), the
    hypothesis and the reference."""

    signals: list[float | None] = field(default_factory=list)
    hypotheses: list[str] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    splits: list[str] = field(default_factory=list)  # "data.splits.valid=val, beam 1", one per direction

    def clear(self) -> None:
        self.signals, self.hypotheses, self.references, self.splits = [], [], [], []

    def keep(
        self,
        best: Sequence[Any],
        sources: Sequence[str],
        hypotheses: Sequence[str],
        references: Sequence[str],
        split: str,
    ) -> None:
        """One direction's decode: `best` the Hypothesis per source, `hypotheses` their text."""
        from mtrain.decode.translation.confidence import mean_log_prob

        self.signals += [
            mean_log_prob(h.log_prob, len(h.tokens)) if source.strip() else None
            for source, h in zip(sources, best, strict=True)
        ]
        self.hypotheses += hypotheses
        self.references += references
        self.splits.append(split)

    def fitted_on(self) -> str:
        """What a calibration fitted on these decodes says it was fitted on."""
        return f"{'; '.join(dict.fromkeys(self.splits))}: {counted(len(self.hypotheses), 'sentence')}"


def write_confidence(run: RunDir, decodes: ValidationDecodes) -> None:
    """The run's confidence calibration (`confidence.json`, mtrain.decode.translation.confidence), fitted on
    the last validation's decodes: their mean token log-probability against their sentence chrF.
    A run that decoded no validation set (train.valid_bleu=false) gets none, or keeps the one it has."""
    from mtrain.decode.translation.confidence import write_calibration
    from mtrain.evaluate.calibration import calibrate

    path = run.confidence_file
    if not any(signal is not None for signal in decodes.signals):
        if not path.is_file():
            log.info(
                "no %s: no validation set was decoded (train.valid_bleu=false); translations get the "
                "uncalibrated score (scripts/measure_confidence.py RUN --write-calibration fits one)",
                path.name,
            )
        return
    start = time.perf_counter()
    try:
        calibration = calibrate(decodes.signals, decodes.hypotheses, decodes.references, decodes.fitted_on())
    except MtrainError as error:  # too few sentences: the run itself is fine
        log.warning("no %s written: %s", path.name, error)
        return
    write_calibration(path, calibration)
    log.info(
        "confidence: %s fitted on %s (%s, %.1f s)",
        path.name,
        calibration.fitted_on,
        counted(len(calibration.knots), "knot"),
        time.perf_counter() - start,
    )


def validation(
    cfg: FitConfig,
    model: Any,
    data: PreparedData,
    machine: Machine,
    trained: Any = None,
    decodes: ValidationDecodes | None = None,
) -> Callable[[], dict[str, float]]:
    """The trainer's validation: loss and perplexity (in the training precision), and BLEU
    (`train.valid_bleu`) through the evaluation path of `mtrain eval` (greedy unless
    `decode.valid_beam` says otherwise, in the machine's decoding precision). All of it runs
    with `train.decode_num_threads` (1 by default, as `mtrain eval` decodes): on busy cores a
    second thread made even the loss 4x slower (threads wait for each other). With
    train.ema_decay `model` is the weights' average and `trained` the trained weights, whose
    loss and perplexity are logged beside (raw_loss, raw_ppl): what the average gains.

    A multilingual run validates each direction (its first `train.valid_max_sentences`
    sentences, decoded with its target language's tag) and reports their mean, which best.pt
    follows, and each direction's perplexity and BLEU (`mean_over_directions`).

    `decodes`, when given, holds the last validation's hypotheses afterwards (the BLEU decode's:
    none without train.valid_bleu)."""
    from mtrain.decode.engines.directions import RunLanguages
    from mtrain.decode.engines.threads import decode_threads
    from mtrain.decode.text.progress import DecodeProgress
    from mtrain.evaluate.scoring import sentence_translator, translate_and_score
    from mtrain.train.validation import mean_over_directions, validation_loss

    decode_cfg = with_values(cfg.decode, beam=cfg.decode.valid_beam, nbest=1)
    languages = RunLanguages.of(cfg.data)
    limit = cfg.train.valid_max_sentences
    several = len(data.directions) > 1
    sets = []  # per direction: its name, encoded split, tokenizer, sources, references, and the split's name
    for direction in data.directions:
        text = direction.valid_text
        sets.append(
            (
                direction.name,
                direction.valid,
                languages.tokenizer_for(data.tokenizer, direction.tgt),
                list(text.src)[:limit],
                list(text.tgt)[:limit],
                split_name(cfg, "valid", data, direction),
            )
        )

    def loss_of(weights: Any, corpus: Any) -> dict[str, float]:
        return validation_loss(
            weights,
            corpus,
            data.tokenizer.special_ids,
            cfg.train.max_tokens,
            cfg.train.label_smoothing,
            machine.device,
            machine.precision,
        )

    def validate() -> dict[str, float]:
        per_direction = {}
        if decodes is not None:
            decodes.clear()  # this validation's, not the last one's
        with decode_threads(cfg.train.decode_num_threads):
            for name, *split in sets:
                per_direction[name] = validate_direction(name, *split)
        return mean_over_directions(per_direction)

    def validate_direction(
        name: str, corpus: Any, tokenizer: Tokenizer, sources: list[str], references: list[str], split_name: str
    ) -> dict[str, float]:
        results = loss_of(model, corpus)
        if trained is not None and trained is not model:
            raw = loss_of(trained, corpus)
            results.update(raw_loss=raw["loss"], raw_ppl=raw["ppl"])
        if cfg.train.valid_bleu:
            label = f"valid {name}" if several else "valid"
            with DecodeProgress(label, len(sources), log_interval(cfg)) as progress:
                translate = sentence_translator(
                    model, tokenizer, decode_cfg, machine.device, machine.decode_precision, progress.update
                )
                best: list[Any] = []

                def translate_keeping(batch: list[str]) -> list[Any]:
                    best[:] = translate(batch)
                    return best

                scored = translate_and_score(translate_keeping, sources, [references], split_name)
            results["bleu"] = scored.scores["bleu"]["score"]
            if decodes is not None:
                decodes.keep(best, sources, scored.hypotheses, references, f"{split_name}, beam {decode_cfg.beam}")
        return results

    return validate


def end_cost_estimate(
    cfg: FitConfig, model: Any, data: PreparedData, machine: Machine, trained: Any = None
) -> Callable[[], EndCost]:
    """What follows training under train.max_time, measured on this machine when called (before
    the first update): one validation as `validation` runs it (its loss, timed on a slice of the
    split and scaled by tokens; its BLEU decode, from a few timed decoding steps, mtrain.decode.translation.cost,
    and its scoring), the test decode with `cfg.decode` and its three metrics, and the checkpoints'
    writing (guessed from the weights' size until a save is timed). The model is left as it was
    found (training mode; decoding and the loss change no weights and draw no random numbers)."""
    from mtrain.batches.corpus import EncodedCorpus
    from mtrain.decode.engines.directions import RunLanguages
    from mtrain.decode.engines.threads import decode_threads
    from mtrain.decode.translation.cost import PROBE_SENTENCES, decode_seconds, measure_step_cost
    from mtrain.train.budget import EndCost, save_seconds_guess
    from mtrain.train.validation import validation_loss

    languages = RunLanguages.of(cfg.data)
    valid_cfg = with_values(cfg.decode, beam=cfg.decode.valid_beam, nbest=1)
    limit = cfg.train.valid_max_sentences
    models = [model] if trained is None or trained is model else [model, trained]

    def loss_seconds(corpus: EncodedCorpus) -> float:
        sample = range(min(PROBE_SENTENCES, len(corpus)))
        piece = EncodedCorpus.from_sequences(
            [corpus.src(i).tolist() for i in sample], [corpus.tgt(i).tolist() for i in sample]
        )

        def loss(weights: Any) -> None:
            validation_loss(
                weights,
                piece,
                data.tokenizer.special_ids,
                cfg.train.max_tokens,
                cfg.train.label_smoothing,
                machine.device,
                machine.precision,
            )

        loss(model)  # the first pass builds what later ones reuse
        start = time.perf_counter()
        for weights in models:
            loss(weights)
        tokens = int(corpus.src_lengths.sum() + corpus.tgt_lengths.sum())
        sampled = int(piece.src_lengths.sum() + piece.tgt_lengths.sum())
        return (time.perf_counter() - start) * tokens / max(sampled, 1)

    def decoding_seconds(corpus: EncodedCorpus, tgt: str, decode_cfg: Any, count: int | None) -> float:
        tokenizer = languages.tokenizer_for(data.tokenizer, tgt)
        sources = [corpus.src(i).tolist() for i in range(min(PROBE_SENTENCES, len(corpus)))]
        cost = measure_step_cost(model, tokenizer, sources, decode_cfg, machine.device, machine.decode_precision)
        lengths = corpus.src_lengths[:count].tolist(), corpus.tgt_lengths[:count].tolist()
        return decode_seconds(cost, *lengths, decode_cfg)

    def estimate() -> EndCost:
        validation = test = 0.0
        try:
            with decode_threads(cfg.train.decode_num_threads):
                for direction in data.directions:
                    validation += loss_seconds(direction.valid)
                    if cfg.train.valid_bleu:
                        validation += decoding_seconds(direction.valid, direction.tgt, valid_cfg, limit)
                        validation += scoring_seconds(list(direction.valid_text.tgt)[:limit], ["bleu"])
                    if direction.test is not None:
                        test += decoding_seconds(direction.test, direction.tgt, cfg.decode, None)
                        test += scoring_seconds(list(direction.test_text.tgt), ["bleu", "chrf", "ter"])
        finally:
            for weights in models:
                weights.train()
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        return EndCost(validation, save_seconds_guess(weight_bytes), test)

    return estimate


def scoring_seconds(references: Sequence[str], metrics: Sequence[str]) -> float:
    """Seconds sacreBLEU takes to score `references`' count of hypotheses, timed on the first 100
    with every third word replaced (TER's shift search costs more the less a hypothesis matches)."""
    from mtrain.evaluate.metrics import score_corpus

    sample = list(references[:100])
    if not sample:
        return 0.0
    hypotheses = [" ".join("a" if i % 3 == 0 else w for i, w in enumerate(line.split())) for line in sample]
    start = time.perf_counter()
    score_corpus(hypotheses, [sample], metrics)
    return (time.perf_counter() - start) * len(references) / len(sample)


class DecodeOutOfTime(Exception):
    """The test decode was skipped or stopped to keep to train.max_time; `line` says so."""

    def __init__(self, line: str) -> None:
        super().__init__(line)
        self.line = line


class ScoringDeadline:
    """When the test decode must end: by `deadline` (`clock()` time: the run's) with its scoring;
    `expected` seconds of decoding and scoring were measured for it. What follows the scores
    (reports, metrics.json, the process's exit) takes about a second past it."""

    def __init__(
        self, deadline: float, expected: float, max_time: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.deadline, self.expected, self.max_time, self.clock = deadline, expected, max_time, clock

    def check_start(self, label: str, references: Sequence[str]) -> float:
        """The deadline of this direction's decode (its scoring, timed on a sample, kept after it), or
        DecodeOutOfTime when what was measured for the test cannot fit in the time left even if it
        was measured twice too long (what is started is stopped at the deadline anyway)."""
        left = self.deadline - self.clock()
        if left <= 0 or self.expected > 2 * left:
            raise DecodeOutOfTime(
                f"{label}: skipped to keep to max_time={self.max_time}: {format_duration(max(left, 0.0))} left "
                f"and the test decode was measured at ~{format_duration(self.expected)}"
            )
        return self.deadline - scoring_seconds(references, ["bleu", "chrf", "ter"])

    def for_each_of(self, directions: int) -> ScoringDeadline:
        """The deadline of a test decode of several directions, each measured at an equal share."""
        return ScoringDeadline(self.deadline, self.expected / max(directions, 1), self.max_time, self.clock)

    def guard(self, label: str, progress: DecodeProgress, decode_deadline: float) -> Callable[[int], None]:
        """`progress.update` for each decoded batch, which raises DecodeOutOfTime before a batch as
        long as the last would end past `decode_deadline`."""
        last = self.clock()

        def on_batch(sentences: int) -> None:
            nonlocal last
            progress.update(sentences)
            now = self.clock()
            batch_seconds, last = now - last, now
            if progress.done < progress.total and now + batch_seconds > decode_deadline:
                raise DecodeOutOfTime(
                    f"{label}: stopped after {progress.done:,} of {progress.total:,} sentences to keep to "
                    f"max_time={self.max_time} (another batch, ~{format_duration(batch_seconds)}, would end past it); "
                    "no score of a part of the split"
                )

        return on_batch


def score_test_split(
    cfg: FitConfig,
    run: RunDir,
    model: Any,
    tokenizer: Tokenizer,
    device: torch.device,
    precision: Precision,
    directions: Sequence[tuple[str, str]] = (),
    deadline: ScoringDeadline | None = None,
) -> dict[str, Any]:
    """Decode the test split with the best checkpoint and score it as `mtrain eval` does, with
    as many threads (`train.decode_num_threads`, 1 by default): the same outputs, as fast.

    A multilingual run (several `directions`) scores each direction, decoded with its target
    language's tag, into its own report (eval/test.de-en.*) and returns the mean of each
    metric with every direction's result under `directions`. With `deadline` (train.max_time)
    a decode that cannot end in time is skipped or stopped: DecodeOutOfTime."""
    from mtrain.checkpoint.files import decode_weights, load_checkpoint
    from mtrain.decode.engines.threads import decode_threads

    best_path = run.find_checkpoint("best")
    best = load_checkpoint(best_path, mmap=True)  # the optimiser's moments in it are never read
    state_dict, weights = decode_weights(best, best_path)  # with train.ema_decay: the average
    model.load_state_dict(state_dict)
    best_update = int(best.get("update", 0))
    del best, state_dict
    model.eval()
    checkpoint_info = {
        "path": str(best_path),
        "which": "best",
        "update": best_update,
        "averaged_from": None,
        "weights": weights,
    }
    with decode_threads(cfg.train.decode_num_threads) as threads:
        decode_info = {
            **to_plain(cfg.decode),
            "device": str(device),
            "precision": precision,
            "engine": Engine.torch,
            "threads": threads,
        }
        return _score_test_directions(
            cfg, run, model, tokenizer, device, precision, directions, checkpoint_info, decode_info, deadline
        )


def _score_test_directions(
    cfg: FitConfig,
    run: RunDir,
    model: Any,
    tokenizer: Tokenizer,
    device: torch.device,
    precision: Precision,
    directions: Sequence[tuple[str, str]],
    checkpoint_info: dict[str, Any],
    decode_info: dict[str, Any],
    deadline: ScoringDeadline | None,
) -> dict[str, Any]:
    """`score_test_split`'s scores once the checkpoint is loaded: one direction's, or the mean
    over several with each one's."""
    from mtrain.decode.engines.directions import RunLanguages

    best_update = checkpoint_info["update"]
    languages = RunLanguages.of(cfg.data)
    directions = list(directions) or languages.directions()[:1]
    if deadline is not None and len(directions) > 1:
        deadline = deadline.for_each_of(len(directions))
    head: dict[str, Any] = {
        "checkpoint": Path(checkpoint_info["path"]).name,
        "update": best_update,
        "weights": checkpoint_info["weights"],
        "beam": cfg.decode.beam,
    }
    if len(directions) == 1:
        tokenizer = languages.tokenizer_for(tokenizer, directions[0][1])
        return {
            **head,
            **_score_test_direction(
                cfg, run, model, tokenizer, device, precision, checkpoint_info, decode_info, None, deadline
            ),
        }
    results = {
        f"{src}-{tgt}": _score_test_direction(
            cfg,
            run,
            model,
            languages.tokenizer_for(tokenizer, tgt),
            device,
            precision,
            checkpoint_info,
            decode_info,
            (src, tgt),
            deadline,
        )
        for src, tgt in directions
    }
    means = {
        metric: sum(result[metric] for result in results.values()) / len(results)
        for metric, value in next(iter(results.values())).items()
        if isinstance(value, float) and not metric.endswith("_per_s")
    }
    return {
        **head,
        "sentences": sum(result["sentences"] for result in results.values()),
        **means,
        "directions": results,
    }


def _score_test_direction(
    cfg: FitConfig,
    run: RunDir,
    model: Any,
    tokenizer: Tokenizer,
    device: torch.device,
    precision: Precision,
    checkpoint_info: dict[str, Any],
    decode_info: dict[str, Any],
    direction: tuple[str, str] | None,
    deadline: ScoringDeadline | None,
) -> dict[str, Any]:
    """One direction's test report (eval/test.json; a multilingual run's eval/test.<src>-<tgt>.json)
    and its scores for metrics.json."""
    from mtrain.decode.text.progress import DecodeProgress
    from mtrain.evaluate.references import read_run_split
    from mtrain.evaluate.scoring import score_split, sentence_translator

    data_cfg = cfg.data if direction is None else with_values(cfg.data, src=direction[0], tgt=direction[1])
    split = read_run_split(run, cfg.data, "test", direction)
    label = "test" if direction is None else f"test {direction[0]}-{direction[1]}"
    decode_deadline = deadline.check_start(label, split.references[0]) if deadline is not None else 0.0
    log.info(
        "%s: decoding %s of %s with %s (update %d), beam %d, %s",
        label,
        counted(len(split.sources), "sentence"),
        split_name_of(cfg, "test"),
        Path(checkpoint_info["path"]).name,
        checkpoint_info["update"],
        cfg.decode.beam,
        counted(decode_info["threads"], "CPU thread"),
    )
    with DecodeProgress(label, len(split.sources), log_interval(cfg)) as progress:
        on_batch = progress.update if deadline is None else deadline.guard(label, progress, decode_deadline)
        report = score_split(
            run,
            "test",
            data_cfg,
            split,
            sentence_translator(model, tokenizer, cfg.decode, device, precision, on_batch),
            checkpoint_info,
            decode_info,
            ["bleu", "chrf", "ter"],
            log=log.info,
            report_name=None if direction is None else f"test.{direction[0]}-{direction[1]}",
        )
    result: dict[str, Any] = {"sentences": report["sentences"], "decode_sentences_per_s": report["sentences_per_s"]}
    for metric, values in report["metrics"].items():
        result[metric] = float(values["score"])
        result[f"{metric}_signature"] = values["signature"]
    return result


def log_test(trainer: Any, test: dict[str, Any]) -> None:
    """The test scores in the log and TensorBoard (a multilingual run: the means, then each direction)."""
    log.info("test | %s", " | ".join(f"{k} {v:.2f}" for k, v in test.items() if isinstance(v, float)))
    trainer.metrics.scalars("test", test, test["update"])
    for name, result in test.get("directions", {}).items():
        log.info("test %s | %s", name, " | ".join(f"{k} {v:.2f}" for k, v in result.items() if isinstance(v, float)))
        trainer.metrics.scalars(f"test/{name}", result, test["update"])
