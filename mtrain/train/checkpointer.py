"""When and where a run's checkpoints are written, and whether one may resume this run.

`last.pt` is the one checkpoint a resume needs: it holds everything, the optimiser's state
included. `update_N.pt` and `best.pt` hold the weights and the small rest, not Adam's two
moments per parameter (`checkpoint_state.without_optimizer`): a third of the size, and all
that averaging, export, translate and eval read. `train.resume_from=update_N` warm-starts
from one (its weights, data position and clock, Adam's moments afresh; the trainer warns).

Each save writes `last.pt` (atomically) and loads it back to verify it, then `update_N.pt`
likewise, then, when it is the best, makes `best.pt` a hard link of it (`rundir.atomic_link`;
a copy where the file system has no hard links): identical checkpoints are stored once. Every
write renames a new file into place, so a later save of one name never changes the other, and
pruning `update_N.pt` leaves `best.pt` whole (the file lives while a name holds it). Old
`update_N.pt` files beyond `train.keep_last` are pruned only after the new ones are known good.
By hand, replace a checkpoint with `mv`, never by writing into it (`cp x best.pt` would also
change the `update_N.pt` it shares its bytes with).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from mtrain.checkpoint.files import load_checkpoint, save_checkpoint
from mtrain.config import FitConfig, resolved_model, to_plain
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, atomic_link
from mtrain.train.checkpoint_state import without_optimizer

log = logging.getLogger("mtrain")

# Config sections a checkpoint can only continue with unchanged values.
RESUME_SECTIONS = ("model", "tokenizer")


class Checkpointer:
    """Writes a run's checkpoints; `due()` says when the wall-clock interval has passed."""

    def __init__(self, run: RunDir, keep_last: int, save_every_seconds: float | None) -> None:
        self.run = run
        self.keep_last = max(1, keep_last)
        self.save_every_seconds = save_every_seconds
        self._last_save_time = time.monotonic()

    def due(self) -> bool:
        """Whether `train.save_every` has passed since the last save."""
        return (
            self.save_every_seconds is not None and time.monotonic() - self._last_save_time >= self.save_every_seconds
        )

    def save(self, state: dict[str, Any], update: int, best: bool) -> Path:
        """Write `state` as last.pt and, without the optimiser's state, as update_N.pt (and
        best.pt); returns update_N.pt's path."""
        path = self.run.update_checkpoint(update)
        # Never prune older checkpoints before the new ones are known good; mapped, not read
        # into memory (the CRC check reads the file through the page cache).
        for target, content in ((self.run.checkpoint("last"), state), (path, without_optimizer(state))):
            save_checkpoint(target, content)
            load_checkpoint(target, mmap=True)
        if best:
            try:
                atomic_link(path, self.run.checkpoint("best"))
            except OSError as error:
                raise MtrainError(
                    f"{self.run.checkpoint('best')}: could not write checkpoint ({error.strerror or error}); "
                    f"last.pt and {path.name} are complete. Free disk space, then resume with train.resume=true"
                ) from error
        for old in self.run.update_checkpoints()[: -self.keep_last]:
            old.unlink()
        self._last_save_time = time.monotonic()
        log.info("saved %s%s and last.pt", path.name, " (best)" if best else "")
        return path

    def remove_stale_temporary_files(self) -> None:
        """Temporary files left by writes that a kill interrupted (never renamed into place)."""
        for path in self.run.stale_temporary_files():
            log.info("removing %s (left by an interrupted write)", path)
            path.unlink()


def data_fingerprints(corpus: str, tokenizer: str) -> dict[str, str]:
    """What a checkpoint records of the data it was trained on (see `check_resumable`)."""
    return {"corpus": corpus, "tokenizer": tokenizer}


def check_resumable_state(state: dict[str, Any], path: Path) -> None:
    """Refuse to resume from a checkpoint that holds weights only (an average of checkpoints, or
    a file made outside training): it has no point of training (loss scaler, random state, data
    position) to continue from."""
    missing = [key for key in ("model", "trainer", "scaler", "rng") if key not in state]
    if not missing and "averaged_from" not in state:
        return
    what = (
        f"an average of {len(state['averaged_from'])} checkpoints"
        if "averaged_from" in state
        else f"no {', '.join(missing)}"
    )
    raise MtrainError(
        f"{path}: holds weights only ({what}), not a point of training to resume; resume from another "
        f"checkpoint (train.resume_from=update_N) or start a new run from these weights (init_from={path}); "
        "nothing was written"
    )


def check_resumable_config(state: dict[str, Any], cfg: FitConfig, path: Path) -> None:
    """Refuse, with one line naming the key, to continue a checkpoint with other model or
    tokenizer settings."""
    saved = dict(state.get("config", {}))
    current = to_plain(cfg)
    # Older runs stored `layers`/`final_norm` unresolved: compare what was built on both sides.
    try:
        saved["model"] = to_plain(OmegaConf.structured(resolved_model(saved.get("model", {}))))
    except Exception as error:
        raise MtrainError(
            f"{path}: its stored model config does not fit this mtrain version "
            f"({str(error).splitlines()[0]}); start a new run"
        ) from error
    current["model"] = to_plain(OmegaConf.structured(resolved_model(current.get("model", {}))))
    for section in RESUME_SECTIONS:
        old, new = saved.get(section, {}), current.get(section, {})
        for key in sorted(set(old) | set(new)):
            if old.get(key) != new.get(key):
                raise MtrainError(
                    f"{path}: checkpoint was trained with {section}.{key}={old.get(key)!r} but the config "
                    f"says {new.get(key)!r}; resume with the original settings or start a new run (nothing was written)"
                )


# The settings term-aware training draws its annotation with (mtrain.batches.term_training): a
# resume draws it again, from the seed, with the values it is given.
TERM_DRAWING_KEYS = ("term_rate", "term_max_words", "term_replace_rate", "term_skip_frequent")


def check_resumable_terms(state: dict[str, Any], cfg: FitConfig, path: Path) -> None:
    """Term-aware training on resume: another `train.term_alignment` (or one added or dropped)
    is other training data, refused in one line as another corpus is; another `term_rate` (or
    the other drawing settings) is accepted, and one log line says the annotation is drawn anew
    (a schedule of term rates is a fine thing to want; a silent change is not)."""
    saved = dict(state.get("config", {}).get("train", {}))
    old, new = saved.get("term_alignment"), cfg.train.term_alignment
    if old != new and not _same_file(old, new):
        raise MtrainError(
            f"{path}: checkpoint was trained with train.term_alignment={old!r} but the config says {new!r}; "
            "resume with the original file, or start a new run from its weights (init_from=...) "
            "(nothing was written)"
        )
    if new is None:
        return
    changed = [
        f"train.{key} {saved[key]} -> {getattr(cfg.train, key)}"
        for key in TERM_DRAWING_KEYS
        if key in saved and saved[key] != getattr(cfg.train, key)
    ]
    if changed:
        log.info(
            "resume: %s: the term annotation is drawn again from the seed with the new value%s; the updates "
            "so far were trained with the checkpoint's",
            ", ".join(changed),
            "s" if len(changed) > 1 else "",
        )


def _same_file(old: str | None, new: str | None) -> bool:
    """Both name one existing file (by another path: a resume from another directory)."""
    if old is None or new is None or not Path(old).is_file() or not Path(new).is_file():
        return False
    return Path(old).samefile(new)


def check_resumable_data(state: dict[str, Any], fingerprints: dict[str, str], path: Path) -> None:
    """Refuse to continue a checkpoint on another encoded corpus or tokenizer vocabulary:
    continuing old weights on new token ids trains a model whose embeddings mean other pieces."""
    stored = state.get("data_fingerprints")
    if stored is None:
        log.warning("%s: written by an older mtrain without data fingerprints; the corpus is not checked", path)
        return
    for name in ("tokenizer", "corpus"):
        if stored.get(name) != fingerprints.get(name):
            what = "tokenizer vocabulary" if name == "tokenizer" else "encoded training data"
            raise MtrainError(
                f"{path}: the {what} differs from the one this checkpoint was trained on "
                f"({name} fingerprint {str(stored.get(name))[:12]} vs {str(fingerprints.get(name))[:12]} now: "
                "data.* settings or the corpus files changed); resume with the original data or start a new "
                "run (nothing was written)"
            )


def is_finished(metrics_file: Path) -> bool:
    """Whether a run's metrics.json records a completed training (its test scored or skipped)."""
    if not metrics_file.is_file():
        return False
    try:
        metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return bool(metrics.get("finished"))
