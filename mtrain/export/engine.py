"""The decoding engine of a run: `open_engine`, the one place that opens one, for
`mtrain translate` and `mtrain eval` alike.

engine=torch: the run's checkpoint loaded into mtrain's model, or, with `ensemble=`, that
checkpoint and the members' decoding together (`mtrain.decode.engines.ensemble`; every member's
tokenizer is checked against run='s before any model loads). engine=ctranslate2: the run's
checkpoint converted on the fly. An `mtrain export` directory as run= is loaded by CTranslate2
whichever engine was asked (the one engine that reads it; a switch from engine=torch, the
default, is announced). The CTranslate2 engine itself (`mtrain.decode.engines.ct2_engine`) only loads
directories that `mtrain export` wrote; converting a checkpoint is this package's job, which
is why the opener lives here, above decoding and below the commands.

The engine's tokenizer bans every tag symbol of the run from the output; `RunEngine.languages`
says which languages the run translates into, and `RunEngine.tokenizer_for(tgt_lang)` is the
tokenizer of one of them (its tag at the start of every source: mtrain.decode.engines.directions).
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mtrain.checkpoint.files import LoadedRun, load_checkpoint, load_run
from mtrain.config import Engine
from mtrain.data.tags import reserved_symbols
from mtrain.decode.engines.ct2_engine import CTranslate2Model, load_ctranslate2
from mtrain.decode.engines.directions import RunLanguages
from mtrain.decode.engines.ensemble import EnsembleModel
from mtrain.errors import MtrainError
from mtrain.export.ctranslate2_model import export_ctranslate2, run_metadata
from mtrain.rundir import RunDir, is_export_dir
from mtrain.runtime import resolve_decode_precision
from mtrain.tokenizer import Tokenizer

log = logging.getLogger("mtrain")


@dataclass
class RunEngine:
    """What decodes, as `mtrain.decode`'s functions take it (their `model`, `tokenizer`, `precision`)."""

    model: Any  # mtrain's nn.Module (engine=torch; an EnsembleModel with ensemble=) or a CTranslate2Model
    tokenizer: Any  # mtrain.tokenizer.Tokenizer
    precision: str  # as decoding runs: fp32|bf16|fp16 (torch), CTranslate2's compute type (int8, float32, ...)
    description: str  # what decodes, for the log: the checkpoint(s), update(s), the engine's weights
    loaded: LoadedRun | None  # run='s checkpoint and stored config; None for an export directory
    members: list[LoadedRun] = field(default_factory=list)  # every checkpoint that decodes, run='s first
    # What the run translates into (None: an export directory that does not say)
    languages: RunLanguages | None = None
    engine: Engine = Engine.torch  # the engine that decodes (an export directory: ctranslate2, whatever was asked)

    def tokenizer_for(self, tgt_lang: str | None, key: str = "tgt_lang") -> Any:
        """The tokenizer that translates into `tgt_lang` (null: the run's one target language; an
        M2M100/NLLB model: any language it knows); MtrainError naming `key` for a language the
        run does not translate into."""
        if self.languages is None:
            if tgt_lang is not None:
                raise MtrainError(
                    f"{key}={tgt_lang}: {self.description} does not record the languages it "
                    "translates; leave tgt_lang unset"
                )
            return self.tokenizer
        if getattr(self.tokenizer, "fairseq", False) and tgt_lang is not None:  # M2M100/NLLB: any language it knows
            return self.languages.tokenizer_for(self.tokenizer, tgt_lang, key=key)
        return self.languages.tokenizer_for(self.tokenizer, self.languages.target(tgt_lang, key), key=key)


def open_engine(
    run: str | Path,
    engine: Engine,
    device: torch.device,
    precision: str = "auto",
    num_threads: int | None = None,
    checkpoint: str | Path = "best",
    weights: str = "auto",
    ensemble: Sequence[str | Path] = (),
    announce: Callable[[str], None] = log.info,
) -> RunEngine:
    """The engine that decodes with `run`'s `checkpoint` (best|last|a name|a path) and its
    `weights` (auto: the weights' average when the run kept one, else the trained ones; ema; raw;
    for every member of an ensemble alike).

    `run` may also be a directory written by `mtrain export`: CTranslate2 decodes it, whatever
    `engine` says (`announce`d when engine=torch was asked, the default).
    `precision`: mtrain's precision names (auto resolved for `device`); CTranslate2 also takes
    its compute types (int8, ...; mtrain.decode.engines.ct2_engine).
    `ensemble`: more members decoding with run='s checkpoint (engine=torch), each a run
    directory (its best checkpoint, as `checkpoint=best` finds it) or a checkpoint file.
    """
    if ensemble:
        if engine != Engine.torch:
            raise MtrainError("ensemble: engine=ctranslate2 decodes one model; decode an ensemble with engine=torch")
        return _ensemble_engine(run, device, precision, checkpoint, ensemble, weights)
    if is_export_dir(Path(run)):
        return _export_engine(Path(run), engine, device, precision, num_threads, str(checkpoint), weights, announce)
    # A checkpoint to convert is read on the CPU: CTranslate2 loads the converted copy on `device`.
    loaded = load_run(
        run, which=str(checkpoint), device=device if engine == Engine.torch else torch.device("cpu"), weights=weights
    )
    languages = _languages_of(loaded)
    tokenizer = languages.reserving(loaded.tokenizer)
    if engine == Engine.ctranslate2:
        model = _converted(loaded, tokenizer, languages, device, precision, num_threads)
        return RunEngine(
            model, tokenizer, model.translator.compute_type, model.description, loaded, [loaded], languages, engine
        )
    resolved = resolve_decode_precision(precision, device)
    return RunEngine(
        loaded.model,
        tokenizer,
        resolved,
        f"{loaded.checkpoint_path} (update {loaded.update}{_weights_note(loaded)}), {resolved}",
        loaded,
        [loaded],
        languages,
    )


def _export_engine(
    directory: Path,
    engine: Engine,
    device: torch.device,
    precision: str,
    num_threads: int | None,
    checkpoint: str,
    weights: str,
    announce: Callable[[str], None],
) -> RunEngine:
    """An `mtrain export` directory, decoded by CTranslate2 (the one engine that reads it). It
    holds one model: `checkpoint` and `weights` other than their defaults are refused."""
    weights = str(getattr(weights, "value", weights))
    what = f"run={directory}: is a CTranslate2 model written by `mtrain export` (one model, not a run directory)"
    if checkpoint != "best":
        raise MtrainError(
            f"checkpoint={checkpoint}: {what}; drop checkpoint=, or export that checkpoint "
            "(mtrain export run=RUN_DIR checkpoint=... out=DIR)"
        )
    if weights != "auto":
        raise MtrainError(f"weights={weights}: {what}, exported with its weights; drop weights=, or export them")
    if engine != Engine.ctranslate2:
        announce(
            f"run={directory} is a CTranslate2 model written by `mtrain export`: decoding it with engine=ctranslate2"
        )
    model = load_ctranslate2(directory, device, precision, num_threads)
    return RunEngine(
        model,
        model.tokenizer,
        model.translator.compute_type,
        model.description,
        None,
        languages=model.languages,
        engine=Engine.ctranslate2,
    )


def _languages_of(loaded: LoadedRun) -> RunLanguages:
    return RunLanguages.of(loaded.config.get("data"))


def _weights_note(loaded: LoadedRun) -> str:
    return ", EMA weights" if loaded.weights == "ema" else ""


def _ensemble_engine(
    run: str | Path,
    device: torch.device,
    precision: str,
    checkpoint: str | Path,
    ensemble: Sequence[str | Path],
    weights: str = "auto",
) -> RunEngine:
    """run='s checkpoint and the `ensemble` members as one EnsembleModel. Every path and
    tokenizer is checked before the first model loads."""
    if is_export_dir(Path(run)):
        raise MtrainError(
            f"run={run}: is a CTranslate2 model written by `mtrain export`; an ensemble decodes "
            "checkpoints of `mtrain fit` runs (engine=torch)"
        )
    run_dir = RunDir(run)
    run_checkpoint = run_dir.find_checkpoint(str(checkpoint))
    run_tokenizer = _tokenizer_of(run_dir, f"run={run}")
    members = [(run_dir, run_checkpoint)] + [_resolve_member(str(entry), run_dir, run_tokenizer) for entry in ensemble]
    loaded = [
        load_run(directory.path, device=device, checkpoint_path=path, weights=weights) for directory, path in members
    ]
    resolved = resolve_decode_precision(precision, device)
    description = (
        f"an ensemble of {len(loaded)}: "
        + ", ".join(f"{member.checkpoint_path} (update {member.update}{_weights_note(member)})" for member in loaded)
        + f", {resolved}"
    )
    languages = _shared_languages(loaded)
    model = EnsembleModel([member.model for member in loaded])
    return RunEngine(
        model, languages.reserving(loaded[0].tokenizer), resolved, description, loaded[0], loaded, languages
    )


def _shared_languages(members: Sequence[LoadedRun]) -> RunLanguages:
    """run='s languages, once every member is checked to use the same tags: a member trained
    without them (or with others) would read the tag as text, or miss it."""
    first = _languages_of(members[0])
    for member in members[1:]:
        languages = _languages_of(member)
        if (languages.lang_tags, reserved_symbols(languages.data)) != (first.lang_tags, reserved_symbols(first.data)):
            raise MtrainError(
                f"ensemble: {member.checkpoint_path} was trained with the tags "
                f"{reserved_symbols(languages.data) or 'none'} (data.lang_tags={languages.lang_tags}), "
                f"run={members[0].checkpoint_path} with {reserved_symbols(first.data) or 'none'} "
                f"(data.lang_tags={first.lang_tags}): the members of an ensemble must share the tags"
            )
    return first


def _tokenizer_of(run_dir: RunDir, name: str) -> Tokenizer:
    if not run_dir.tokenizer_dir.is_dir():
        raise MtrainError(f"{name}: no tokenizer/ directory; the run directory is incomplete")
    return Tokenizer.load(run_dir.tokenizer_dir)


def _resolve_member(entry: str, run_dir: RunDir, run_tokenizer: Tokenizer) -> tuple[RunDir, Path]:
    """The run directory whose tokenizer decodes `entry`, and `entry`'s checkpoint file.

    A directory: a run of `mtrain fit`, decoded with its best checkpoint. A file: a checkpoint;
    inside a run's checkpoints/ it is that run's, otherwise (an average written with out=, a
    copied file) it must record run='s tokenizer fingerprint, and decodes with run='s tokenizer.
    """
    path = Path(entry)
    if not entry.strip() or not path.exists():
        raise MtrainError(f"ensemble: {entry!r}: no such run directory or checkpoint file")
    if path.is_dir():
        if is_export_dir(path):
            raise MtrainError(
                f"ensemble: {path}: is a CTranslate2 model written by `mtrain export`; ensemble "
                "members are run directories or checkpoint files of `mtrain fit`"
            )
        member_dir = RunDir(path)
        try:
            checkpoint = member_dir.find_checkpoint("best")
        except MtrainError as error:
            raise MtrainError(f"ensemble: {error}") from error
    else:
        checkpoint = path
        owner = RunDir(path.parent.parent)
        if owner.checkpoint_dir != path.parent or not owner.tokenizer_dir.is_dir():
            _check_recorded_tokenizer(path, run_dir, run_tokenizer)
            return run_dir, checkpoint
        member_dir = owner
    tokenizer = _tokenizer_of(member_dir, f"ensemble: {path}")
    if tokenizer.fingerprint != run_tokenizer.fingerprint:
        raise MtrainError(
            f"ensemble: {member_dir.tokenizer_dir} differs from run={run_dir.path}'s tokenizer "
            f"{run_dir.tokenizer_dir}: the members of an ensemble must share one tokenizer "
            "(the same token ids must mean the same pieces)"
        )
    return member_dir, checkpoint


def _check_recorded_tokenizer(path: Path, run_dir: RunDir, run_tokenizer: Tokenizer) -> None:
    """A checkpoint outside a run directory decodes with run='s tokenizer: the fingerprint
    it recorded in training (`data_fingerprints`) must be that tokenizer's."""
    recorded = (load_checkpoint(path, mmap=True).get("data_fingerprints") or {}).get("tokenizer")
    if recorded is None:
        raise MtrainError(
            f"ensemble: {path}: is not in a run's checkpoints/ and records no tokenizer fingerprint, "
            f"so nothing says it shares run={run_dir.path}'s tokenizer; give it from its run directory"
        )
    if recorded != run_tokenizer.fingerprint:
        raise MtrainError(
            f"ensemble: {path} was trained with another tokenizer than run={run_dir.path}'s "
            f"{run_dir.tokenizer_dir} (fingerprint {recorded[:12]} vs {run_tokenizer.fingerprint[:12]}): "
            "the members of an ensemble must share one tokenizer"
        )


def _converted(
    loaded: LoadedRun,
    tokenizer: Tokenizer,
    languages: RunLanguages,
    device: torch.device,
    precision: str,
    num_threads: int | None,
) -> CTranslate2Model:
    """A loaded run converted in fp32 into a temporary directory and loaded from there
    (CTranslate2 quantizes on load when `precision` asks) with `tokenizer` (its tags banned)."""
    with tempfile.TemporaryDirectory(prefix="mtrain-ct2-") as scratch:
        model_dir = export_ctranslate2(
            loaded.model.state_dict(),
            loaded.config.model,
            loaded.tokenizer,
            Path(scratch) / "model",
            metadata=run_metadata(loaded),
        )
        # The weights are in memory once loaded; the run's tokenizer outlives the scratch copy.
        model = load_ctranslate2(model_dir, device, precision, num_threads, tokenizer)
    model.languages = languages
    model.description = (
        f"{loaded.checkpoint_path} (update {loaded.update}{_weights_note(loaded)}, converted), "
        f"{model.translator.compute_type}"
    )
    return model
