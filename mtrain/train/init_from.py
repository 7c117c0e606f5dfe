"""`init_from`: a new run that starts from another run's weights (fine-tuning, continued training).

What a fit takes from its parent (fairseq's --finetune-from-model, Marian's --pretrained-model):

- or a Hugging Face model directory (a MarianMTModel such as OPUS-MT's, or mtrain's own
  `export format=hf`; a hub id is downloaded, HF_HUB_OFFLINE honoured): its weights, its
  tokenizer files and its config as model and tokenizer sections (mtrain.train.hf_parent);
  an M2M100/NLLB vocabulary trimmed to the rows the corpora use with `init_vocab=corpus`
  (mtrain.train.vocab_trim);
- the weights of one checkpoint: a run directory's `best.pt` (`last.pt` before its first
  validation, as translate/eval find `checkpoint=best`) or the checkpoint file named;
  `init_weights` picks its average (train.ema_decay) or its trained weights (`decode_weights`),
  loaded bit-exactly. With `init_keep_optimizer` also Adam's moments (only `last.pt` holds them);
  otherwise the optimiser, the schedule, the data and the clock are the new run's own;
- the tokenizer: the parent run's `tokenizer/` encodes the new data (nothing is trained), and
  the config's `tokenizer` section is the parent's;
- the model section: the parent's recorded one with the command line's explicit `model.KEY=`
  overrides on top. A key that fixes the weights' shapes or what they compute (d_model,
  layers, heads, activation, positions, norms, tying, ...) must keep the parent's value: a
  differing one is refused naming the key and both values. Regularisation and how the same
  computation is carried out (`FREE_MODEL_KEYS`) may change, and `model.term_factors=true` may
  turn a plain parent term-aware (its factor embedding starts at zero: the same outputs). Presets (experiment=, model=)
  do not reach the model: the parent's weights already decided it.
- `model.output_vocab=target`: the softmax ranges over the pieces the parent could emit and
  those of the new training targets (`output_pieces`), so the fine-tune neither loses the
  parent's output vocabulary nor is unable to emit the new domain's pieces.

The new run records where it came from (`Lineage`: the parent's path, the checkpoint file
and its sha256, the update, which weights, the parent's config) in `parent.yaml` beside
`config.yaml`, in `metrics.json` and in every checkpoint. A resume (train.resume=true) of
such a run continues from its own checkpoints and takes model and tokenizer settings from
its own record (`resumed_config`): the parent is never read again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from mtrain.checkpoint.files import decode_weights, load_checkpoint, stored_config
from mtrain.config import (
    DataConfig,
    DecodeWeights,
    FitConfig,
    InitVocab,
    ModelConfig,
    Positions,
    TokenizerConfig,
    check_model_config,
    resolved_model,
)
from mtrain.data.provenance import file_sha256
from mtrain.data.tags import reserved_symbols
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir
from mtrain.tokenizer import Tokenizer
from mtrain.train.checkpoint_state import has_optimizer_state
from mtrain.train.hf_parent import check_languages, is_hf_directory, parent_record, read_hf_model, resolve_hub_id
from mtrain.train.vocab_trim import trim_imported

# Model keys a fine-tune may set to other values than the parent's: regularisation, training-only
# switches and how the same computation runs. Every other key fixes the weights' shapes or meaning.
FREE_MODEL_KEYS = (
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "detach_memory",
    "attention_impl",
    "output_vocab",
)
# Positions without a learned table hold no weights per position: their range may change.
_TABLE_FREE_POSITIONS = (Positions.sinusoidal, Positions.sinusoidal_marian, Positions.rope, Positions.none)

Lineage = dict[str, Any]  # what a run records of its parent (see the module docstring)
TERM_FACTOR_WEIGHT = "src_embed.factors.weight"  # model.term_factors' table (a plain parent has none)


@dataclass
class Parent:
    """What a new run takes from the run it starts from."""

    checkpoint: Path
    state_dict: dict[str, torch.Tensor]  # the chosen weights (init_weights)
    optimizer: dict[str, Any] | None  # Adam's state, with init_keep_optimizer
    config: DictConfig  # the parent's FitConfig, as its checkpoint recorded it
    tokenizer: Tokenizer
    lineage: Lineage


def load_parent(
    init_from: str,
    weights: DecodeWeights | str,
    keep_optimizer: bool,
    data_cfg: DataConfig,
    vocab: InitVocab | str = InitVocab.full,
) -> Parent:
    """The parent named by `init_from` (a run directory or a checkpoint file), checked: its
    checkpoint loads, holds the weights and optimiser state asked for, and has a tokenizer
    that is the one it was trained with and that holds `data_cfg`'s tag symbols."""
    source = f"init_from={init_from}"
    path = Path(init_from).expanduser()
    if not path.exists():
        path = resolve_hub_id(init_from) or path
    if is_hf_directory(path):
        return _imported_parent(path, weights, keep_optimizer, data_cfg, source, InitVocab(vocab))
    if InitVocab(vocab) != InitVocab.full:
        raise MtrainError(
            f"init_vocab={InitVocab(vocab).value}: {source} is a run, whose vocabulary its weights were trained "
            "with; trimming is for an imported M2M100/NLLB-200 model directory (drop init_vocab)"
        )
    run, checkpoint = _parent_files(path, source)
    before = _identity(checkpoint)
    sha256 = file_sha256(checkpoint)
    try:
        state = load_checkpoint(checkpoint, map_location="cpu", mmap=not keep_optimizer)
        config = stored_config(state, checkpoint)
    except MtrainError as error:
        raise MtrainError(f"{source}: {error}") from error
    if _identity(checkpoint) != before:  # a parent still training replaced it: the sha256 would lie
        raise MtrainError(
            f"{source}: {checkpoint} was replaced while it was read (is its run still training?); "
            "try again, or name a checkpoint that stays (update_N.pt)"
        )
    if run is None:
        raise MtrainError(
            f"{source}: a checkpoint outside a run's checkpoints/ directory; the fine-tune needs "
            "the parent run's tokenizer/: give the run directory or a checkpoint inside it"
        )
    weights = str(getattr(weights, "value", weights))
    if weights == "ema" and "ema" not in state:
        raise MtrainError(
            f"init_weights=ema: {checkpoint} holds no average of the weights (its run trained "
            "without train.ema_decay); use init_weights=auto or init_weights=raw"
        )
    if keep_optimizer and not has_optimizer_state(state):
        raise MtrainError(
            f"init_keep_optimizer=true: {checkpoint} holds no optimiser state (only a run's "
            f"last.pt keeps Adam's moments); give init_from={run.checkpoint('last')}, or drop "
            "init_keep_optimizer"
        )
    state_dict, chosen = decode_weights(state, checkpoint, weights)
    tokenizer = _parent_tokenizer(run, state, source)
    _check_tags(tokenizer, data_cfg, source)
    lineage = {
        "from": str(path.resolve()),
        "checkpoint": str(checkpoint.resolve()),
        "sha256": sha256,
        "update": int(state.get("update", 0)),
        "weights": chosen,
        "keep_optimizer": bool(keep_optimizer),
        "tokenizer": tokenizer.fingerprint,
        "config": state["config"],  # as the checkpoint recorded it (plain containers)
    }
    return Parent(checkpoint, state_dict, state["optimizer"] if keep_optimizer else None, config, tokenizer, lineage)


def _imported_parent(
    directory: Path,
    weights: DecodeWeights | str,
    keep_optimizer: bool,
    data_cfg: DataConfig,
    source: str,
    vocab: InitVocab = InitVocab.full,
) -> Parent:
    """A Hugging Face model directory as the parent (mtrain.train.hf_parent): its weights,
    its tokenizer files as they are, and its config as a model and tokenizer section."""
    weights = str(getattr(weights, "value", weights))
    if weights == "ema" or keep_optimizer:
        key = "init_weights=ema" if weights == "ema" else "init_keep_optimizer=true"
        raise MtrainError(
            f"{key}: {source} is a Hugging Face model, which holds one set of weights and no optimiser state; drop {key}"
        )
    imported = read_hf_model(directory, source)
    check_languages(imported, data_cfg, source)
    _check_tags(imported.tokenizer, data_cfg, source)
    trimmed = None
    if vocab == InitVocab.corpus:  # (mtrain.train.vocab_trim: the rows the corpora use)
        imported, trimmed = trim_imported(imported, data_cfg, source)
    config, lineage = parent_record(imported, directory)
    if trimmed is not None:
        lineage["vocab"] = trimmed
    return Parent(
        imported.weight_files[0], imported.state_dict, None, OmegaConf.create(config), imported.tokenizer, lineage
    )


def _parent_files(path: Path, source: str) -> tuple[RunDir | None, Path]:
    """(the parent's RunDir, its checkpoint file): a run directory's best checkpoint (last.pt
    before its first validation), or a checkpoint file; the run is None for a file outside a
    run's checkpoints/ (no tokenizer beside it)."""
    if path.is_dir():
        run = RunDir(path)
        if not run.has_checkpoints():
            raise MtrainError(
                f"{source}: no checkpoints in {run.checkpoint_dir}; is it a run directory written "
                "by `mtrain fit`? Give a run directory or a checkpoint file"
            )
        try:
            return run, run.find_checkpoint("best")
        except MtrainError as error:  # update_N.pt only: name one
            raise MtrainError(f"{source}: {error}; give init_from=<a checkpoint file>") from error
    if not path.is_file():
        raise MtrainError(f"{source}: no such run directory or checkpoint file")
    run = RunDir(path.parent.parent)
    return (run if run.checkpoint_dir.resolve() == path.parent.resolve() else None), path


def _parent_tokenizer(run: RunDir, state: dict[str, Any], source: str) -> Tokenizer:
    if not run.tokenizer_dir.is_dir():
        raise MtrainError(
            f"{source}: the parent run has no tokenizer/ ({run.tokenizer_dir}), so its token ids "
            "cannot be read; the run directory is incomplete: restore tokenizer/ or choose another parent"
        )
    tokenizer = Tokenizer.load(run.tokenizer_dir)
    recorded = (state.get("data_fingerprints") or {}).get("tokenizer")
    if recorded is not None and recorded != tokenizer.fingerprint:
        raise MtrainError(
            f"{source}: {run.tokenizer_dir} is not the tokenizer its checkpoint was trained with "
            f"(fingerprint {tokenizer.fingerprint[:12]} vs {recorded[:12]} recorded): its ids would "
            "name other pieces; restore the run's own tokenizer/ or choose another parent"
        )
    return tokenizer


def _check_tags(tokenizer: Tokenizer, data_cfg: DataConfig, source: str) -> None:
    """The tag symbols this run's data puts on its sources must be pieces of the parent's vocabulary."""
    symbols = reserved_symbols(data_cfg)
    if not symbols:
        return
    pieces = set(tokenizer.src_pieces(range(tokenizer.src_vocab_size)))
    missing = [symbol for symbol in symbols if symbol not in pieces]
    if missing:
        raise MtrainError(
            f"{source}: the parent's tokenizer has no piece {', '.join(missing)}, which this run's "
            "data.lang_tags/data.corpora tags put on every source; fine-tune without that tag, or "
            "start a new run whose tokenizer reserves it"
        )


def _identity(path: Path) -> tuple[int, int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_size, stat.st_mtime_ns


# ----------------------------------------------------------------------------- the config
def explicit_keys(command_line: Sequence[str], section: str) -> list[str]:
    """The keys of `section` that the command line's overrides set (`model.dropout=0.2`,
    `+model.x=`, `++model.x=`, `~model.x`), in order; the section itself (`model=NAME`) as ""."""
    keys: list[str] = []
    for entry in command_line:
        key = str(entry).split("=", 1)[0].lstrip("+~").strip()
        if key == section:
            keys.append("")
        elif key.startswith(section + "."):
            keys.append(key[len(section) + 1 :])
    return keys


def inherited_config(
    cfg: FitConfig, parent_config: DictConfig, command_line: Sequence[str], source: str, check_fixed: bool = True
) -> FitConfig:
    """`cfg` whose model section is `parent_config`'s with the command line's explicit model keys on
    top, and whose tokenizer section is `parent_config`'s. With `check_fixed`, an explicit key that
    would change the weights' shapes or meaning, or the tokenizer, is refused (one line)."""
    model_keys, tokenizer_keys = explicit_keys(command_line, "model"), explicit_keys(command_line, "tokenizer")
    for section, keys in (("model", model_keys), ("tokenizer", tokenizer_keys)):
        if "" in keys:
            raise MtrainError(
                f"{section}: a {section} preset on the command line, but with {source} the {section} "
                f"is the parent's; drop it (single keys such as model.dropout=0.2 may change)"
            )
    parent_model = resolved_model(parent_config.model)
    explicit = {key: getattr(cfg.model, key) for key in model_keys}
    model = resolved_model(dataclasses.replace(parent_model, **explicit))
    try:
        parent_tokenizer = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(TokenizerConfig), parent_config.get("tokenizer", {}))
        )
    except Exception as error:
        raise MtrainError(
            f"{source}: the parent's tokenizer config does not fit this mtrain version ({str(error).splitlines()[0]})"
        ) from error
    assert isinstance(parent_tokenizer, TokenizerConfig)  # to_object builds the schema's dataclass
    if check_fixed:
        _check_fixed_model_keys(parent_model, model, model_keys, source)
        for key in tokenizer_keys:
            if getattr(cfg.tokenizer, key) != getattr(parent_tokenizer, key):
                raise MtrainError(
                    f"tokenizer.{key}={_shown(getattr(cfg.tokenizer, key))}: {source} reuses the parent's "
                    f"tokenizer, trained with tokenizer.{key}={_shown(getattr(parent_tokenizer, key))}; "
                    "drop the override"
                )
    inherited = dataclasses.replace(cfg, model=model, tokenizer=parent_tokenizer)
    _check_inherited(inherited, source)
    return inherited


def _check_inherited(cfg: FitConfig, source: str) -> None:
    """The rules `mtrain fit` checks its command line's config with, on the model the parent
    gives (its heads, layers, ...), so that a parent's bad value is refused before the run
    directory is written, not when the model is built."""
    try:
        check_model_config(cfg.model)
        cfg.check("")  # the rules between sections: guided alignment's layer and head, term factors
    except MtrainError as error:
        raise MtrainError(f"{error} (the model section of {source})") from error


def _check_fixed_model_keys(parent: ModelConfig, model: ModelConfig, explicit: Sequence[str], source: str) -> None:
    for field in dataclasses.fields(ModelConfig):
        key = field.name
        if key in FREE_MODEL_KEYS or key == "layers":  # layers: resolved into encoder/decoder_layers
            continue
        if key == "max_positions" and model.positions in _TABLE_FREE_POSITIONS:
            continue
        old, new = getattr(parent, key), getattr(model, key)
        if old == new or (key == "term_factors" and new):  # factors added start at zero: same outputs
            continue
        given = (
            f"model.{key}={_shown(new)}"
            if key in explicit
            else f"model.layers={model.layers} (model.{key}={_shown(new)})"
        )
        raise MtrainError(
            f"{given}: the weights of {source} have model.{key}={_shown(old)}, and a fine-tune keeps "
            f"the parent's shapes and layers; drop the override (model.{', model.'.join(FREE_MODEL_KEYS)} "
            "may change)"
        )


def _shown(value: Any) -> str:
    return str(getattr(value, "value", value))


def resumed_config(cfg: FitConfig, checkpoint: dict[str, Any], path: Path, command_line: Sequence[str]) -> FitConfig:
    """The config a resume of a run started with init_from continues with: model and tokenizer
    sections and the init_* keys from the run's own checkpoint (the command line's explicit model
    keys on top, for `check_resumable_config` to judge as for any resume). Other runs: `cfg`."""
    lineage = checkpoint.get("init")
    if not lineage:
        return cfg
    stored = stored_config(checkpoint, path)
    cfg = inherited_config(cfg, stored, command_line, f"the run's own checkpoint {path}", check_fixed=False)
    return dataclasses.replace(
        cfg,
        init_from=stored.get("init_from"),
        init_weights=DecodeWeights(stored.get("init_weights", "auto")),
        init_keep_optimizer=bool(stored.get("init_keep_optimizer", False)),
        init_vocab=InitVocab(stored.get("init_vocab", "full")),
    )


# ----------------------------------------------------------------------------- the model
def load_parent_weights(model: torch.nn.Module, parent: Parent) -> None:
    """Copy the parent's chosen weights into `model` (built from the inherited model config):
    every parameter and saved buffer bit-exactly. The output vocabulary's mask (`output_allowed`)
    is set afterwards from `output_pieces`; a model without one (output_vocab=full) drops it."""
    own = set(model.state_dict())
    state = {key: value for key, value in parent.state_dict.items() if key in own or key != "output_allowed"}
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)  # both are judged below
    except RuntimeError as error:
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        raise MtrainError(
            f"{parent.checkpoint}: its weights do not fit the model of its recorded config "
            f"({lines[1] if len(lines) > 1 else lines[0]}); was it written by another mtrain "
            "version?"
        ) from error
    # A plain parent fine-tuned with model.term_factors: the factor embedding keeps its zeros.
    missing = [key for key in missing if key not in ("output_allowed", TERM_FACTOR_WEIGHT)]
    if missing or unexpected:
        raise MtrainError(
            f"{parent.checkpoint}: its weights do not fit the model of its recorded config "
            f"(missing {missing[:3]}, unexpected {list(unexpected)[:3]}); was it written by "
            "another mtrain version?"
        )


def output_pieces(parent: Parent | None) -> list[int]:
    """The pieces the parent's softmax ranged over with model.output_vocab=target ([] otherwise)."""
    if parent is None or "output_allowed" not in parent.state_dict:
        return []
    return torch.nonzero(parent.state_dict["output_allowed"]).flatten().tolist()


def keep_parent_optimizer(optimizer: torch.optim.Optimizer, parent: Parent) -> None:
    """Adam's moments (and step counts) of the parent, under this run's own hyperparameters
    (learning rate, betas, eps, weight decay are the new run's param_groups)."""
    saved = parent.optimizer
    if saved is None:
        return
    own = optimizer.state_dict()
    counts = [len(group["params"]) for group in own["param_groups"]]
    if counts != [len(group["params"]) for group in saved["param_groups"]]:
        raise MtrainError(
            f"init_keep_optimizer=true: the optimiser state of {parent.checkpoint} is for another "
            "set of parameters; drop init_keep_optimizer"
        )
    optimizer.load_state_dict({"state": saved["state"], "param_groups": own["param_groups"]})
