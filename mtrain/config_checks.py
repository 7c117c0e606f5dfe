"""Checks of a composed config before any work: unknown keys, the schema's rules, and what
needs the file system or another run.

OmegaConf checks keys, types and choices while Hydra composes the config (mtrain.config);
`check_config` runs once at the start of every command, before any data is read or any file
written (mtrain.cli.common), so each bad value costs one line, `<key>: <why>`, not a traceback
after the training budget is spent. It refuses keys outside the schema, walks the typed config
(ranges are field metadata, cross-key rules each dataclass's `check`: mtrain.config,
mtrain.config_fields), then checks here what the schema cannot know: that files exist or can
be written, and what the run to decode is (an `mtrain export` directory decoded by
CTranslate2, how many decoder layers its config.yaml says it has, whether it reads terms).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from mtrain.config import (
    DEFAULT_ALIGNMENT_LAYER,
    AlignmentLevel,
    AverageConfig,
    ConstraintOrder,
    DecodeConfig,
    DecodingCommandConfig,
    Engine,
    EvalConfig,
    FitConfig,
    Precision,
    ServeConfig,
    TranslateConfig,
    is_hub_id,
    to_typed,
)
from mtrain.config_fields import check_section
from mtrain.config_names import did_you_mean, did_you_mean_key, schema_keys
from mtrain.decoding_rules import Asked, check_decoding, check_nbest, check_term_mode
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, is_export_dir, training_checkpoint_of


def check_config(cfg: Any) -> None:
    """Raise MtrainError("<key>: <why>") for the first bad value of a command's config (the
    composed node, or its dataclass)."""
    if OmegaConf.is_config(cfg):
        check_known_keys(cfg)
    typed = to_typed(cfg)
    check_section(typed)
    if isinstance(typed, FitConfig):
        _check_fit_files(typed)
        check_nbest(typed.decode)
        _refuse_quality_decoding_in_fit(typed.decode)
    elif isinstance(typed, DecodingCommandConfig):
        _check_decoding_precision(typed)
        check_nbest(typed.decode)
        if isinstance(typed, TranslateConfig):
            _check_format(str(typed.format), "format")
            if typed.output is not None:
                check_writable_file(Path(typed.output), "output")
            _check_target_control_files(typed)
        elif typed.terms is not None and not Path(str(typed.terms)).is_file():
            raise MtrainError(f"terms={typed.terms}: no such file")
        _check_combinations(typed)
        if isinstance(typed, ServeConfig):
            if typed.api_keys_file is not None and not Path(typed.api_keys_file).is_file():
                raise MtrainError(f"api_keys_file: {typed.api_keys_file} is not a file (one API key per line)")
        elif isinstance(typed, EvalConfig) and typed.out is not None:
            check_writable_dir(Path(typed.out), "out")
        check_alignment_layer_of_run(typed)
        check_term_mode_of_run(typed)
    elif isinstance(typed, AverageConfig):
        _check_average_out(typed)


def check_known_keys(cfg: Any, prefix: str = "") -> None:
    """Refuse keys outside the typed schema. Hydra rejects `model.d_modle=512`, but
    `+model.d_modle=512` appends the key even to a typed config, and nothing would read it."""
    schema = OmegaConf.get_type(cfg)
    if not dataclasses.is_dataclass(schema):
        return  # a free-form mapping (e.g. data.hub.splits)
    known = [field.name for field in dataclasses.fields(schema)]
    for key in cfg:
        if key not in known:
            raise MtrainError(
                f"{prefix}{key}: unknown config key (not in {schema.__name__}); check its spelling"
                + did_you_mean_key(f"{prefix}{key}", [f"{prefix}{name}" for name in schema_keys(schema)])
            )
        if dataclasses.is_dataclass(OmegaConf.get_type(cfg, key)):  # a section (read without resolving)
            check_known_keys(cfg[key], f"{prefix}{key}.")


# ----------------------------------------------------------------------------- files and runs
def _check_fit_files(cfg: FitConfig) -> None:
    """The files a run reads: the guided- and term-alignment files, tokenizer.path and init_from exist
    (what init_from holds is checked when the run starts: mtrain.train.init_from)."""
    train = cfg.train
    for key in ("guided_alignment", "term_alignment"):
        alignment = getattr(train, key)
        if alignment is not None and not Path(alignment).is_file():
            raise MtrainError(
                f"train.{key}: {alignment} is not a file (Pharaoh word alignments of "
                "the training corpus, e.g. from scripts/align_eflomal.py)"
            )
    path = cfg.tokenizer.path
    # (a resumed run encodes with its own copy in the run directory: the origin may be gone)
    if path is not None and not train.resume and not Path(str(path)).expanduser().is_dir():
        raise MtrainError(
            f"tokenizer.path: {path!r}: no such directory (a run directory, its tokenizer/ or a cache entry)"
        )
    if cfg.init_from is not None:
        init_from = str(cfg.init_from)
        if not init_from.strip() or not (Path(init_from).expanduser().exists() or is_hub_id(init_from)):
            raise MtrainError(
                f"init_from: {cfg.init_from!r}: no such run directory, checkpoint file or model directory"
            )


def _decodes_with_ctranslate2(cfg: DecodingCommandConfig) -> bool:
    """engine=ctranslate2, or run= an `mtrain export` directory (CTranslate2 decodes it, whatever engine says)."""
    return cfg.engine == Engine.ctranslate2 or (cfg.run is not None and is_export_dir(str(cfg.run)))


def check_alignment_layer_of_run(cfg: DecodingCommandConfig) -> None:
    """Word alignments (decode.alignment, or translate's markup, put back by them) read a decoder
    layer and head the run has: its config.yaml says how many, so a 1-layer decoder is refused
    here, naming decode.alignment_layer, and not once the model has loaded."""
    decode = cfg.decode
    fmt = str(cfg.format) if isinstance(cfg, TranslateConfig) else "text"
    markup = fmt != "text"
    if (decode.alignment_level is AlignmentLevel.none and not markup) or cfg.run is None:
        return
    if _decodes_with_ctranslate2(cfg):
        return  # the last layer, the only one `mtrain export` writes (checked by _check_alignment)
    run_config = _trained_config(cfg.run)
    if run_config is None:
        return  # not a run directory, or one without its config: said when the run loads
    try:
        model = run_config.model
        layers = int(model.decoder_layers if model.get("layers") is None else model.layers)
        heads = int(model.heads)
        guided = run_config.train.get("guided_alignment") is not None
    except Exception:  # a config.yaml that is not a run's: said when the run loads
        return
    layer = decode.alignment_layer
    if layer is None and decode.alignment_head is None and guided:
        return  # the head it trained (mtrain.decode.translation.alignment), a layer it has
    why = "alignments" if not markup else f"format={fmt} (its tags are put back by word alignments)"
    if layer is None:
        layer = DEFAULT_ALIGNMENT_LAYER
        if not -layers <= layer < layers:
            raise MtrainError(
                f"decode.alignment_layer: null reads layer {layer} (the penultimate) for {why}, and run={cfg.run} "
                f"has a {layers}-layer decoder; set decode.alignment_layer=-1 (its last layer)"
            )
    if not -layers <= layer < layers:
        raise MtrainError(
            f"decode.alignment_layer: {layer} is not a layer of run={cfg.run}'s {layers}-layer decoder "
            f"(0..{layers - 1}, or negative from the last)"
        )
    head = decode.alignment_head
    if head is not None and not -heads <= head < heads:
        raise MtrainError(f"decode.alignment_head: {head} is not one of run={cfg.run}'s {heads} heads (0..{heads - 1})")


def check_term_mode_of_run(cfg: DecodingCommandConfig) -> None:
    """A glossary's terms written into the source (decode.term_mode=annotation|both) need a run
    that reads them: its config.yaml says whether it does (model.term_factors), so a plain run is
    refused here, before it loads, in the words the request pipeline refuses it with once
    loaded (mtrain.decoding_rules.check_term_mode). serve: any request may bring terms."""
    glossary = isinstance(cfg, ServeConfig) or cfg.terms is not None
    if not glossary or cfg.run is None or cfg.ensemble or _decodes_with_ctranslate2(cfg):
        return  # (an ensemble's members and an export: the pipeline asks the loaded model)
    run_config = _trained_config(cfg.run)
    try:
        term_aware = bool(run_config.model.get("term_factors", False)) if run_config is not None else None
    except Exception:  # a config.yaml that is not a run's: said when the run loads
        term_aware = None
    if term_aware is not None:
        check_term_mode(cfg.decode, glossary, term_aware)


def _trained_config(run: str) -> Any:
    """The config run= trained with (its config.yaml, else Hydra's copy), or None where it has
    none that reads as YAML (not a run directory: said when the run loads)."""
    run_dir = RunDir(run)
    config_file = next(
        (path for path in (run_dir.config_file, run_dir.hydra_dir / "config.yaml") if path.is_file()), None
    )
    if config_file is None:
        return None
    try:
        return OmegaConf.load(config_file)
    except Exception:  # not YAML: said when the run loads
        return None


def _check_decoding_precision(cfg: DecodingCommandConfig) -> None:
    """`precision` of translate/eval/serve: mtrain's precisions with engine=torch (CTranslate2,
    and so an `mtrain export` directory as run=, also takes its compute types, checked by
    mtrain.decode.engines.ct2_engine)."""
    allowed = [member.value for member in Precision]
    exported = cfg.run is not None and is_export_dir(str(cfg.run))  # CTranslate2 decodes it, whatever engine says
    if cfg.engine == Engine.torch and cfg.precision not in allowed and not exported:
        raise MtrainError(
            f"precision: {cfg.precision!r} is not one of {'|'.join(allowed)} with engine=torch"
            + did_you_mean(str(cfg.precision), allowed)
        )


def _check_average_out(cfg: AverageConfig) -> None:
    """The average's file (out=, else run='s average_last<N>.pt) replaces an existing file only
    with force=true, and a run's own training checkpoint never: last.pt without its optimiser
    state would end the next resume."""
    if cfg.out:
        out, key = Path(cfg.out), f"out={cfg.out}"
    elif cfg.run and not cfg.checkpoints:
        out = RunDir(cfg.run).checkpoint(f"average_last{cfg.last}")
        key = f"run={cfg.run} last={cfg.last}: {out}"
    else:
        return  # nothing to average, or no out= for checkpoints=[...]: said when the command runs
    run = training_checkpoint_of(out)
    if run is not None:
        raise MtrainError(
            f"{key}: is {out.resolve().name} of the run {run.path}, which training writes and a resume reads; an "
            "average never replaces it, whatever force says: write it to another file (nothing was written)"
        )
    if out.is_dir():
        raise MtrainError(f"{key}: is a directory; give a file name")
    if out.exists() and not cfg.force:
        raise MtrainError(
            f"{key}: already exists; pass force=true to replace it, or write the average to another "
            "file with out=FILE (nothing was written)"
        )


def check_writable_file(path: Path, key: str) -> None:
    """A file `path` can be created or replaced (its directory exists and is writable)."""
    if path.is_dir():
        raise MtrainError(f"{key}: {path} is a directory; give a file name")
    directory = path.parent
    if not directory.is_dir():
        raise MtrainError(f"{key}: {path}: the directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise MtrainError(f"{key}: {path} is not writable; choose another path")


def check_writable_dir(path: Path, key: str, advice: str | None = None) -> None:
    """A directory `path` exists and is writable, or can be created; else MtrainError naming
    `key`, with `advice` (default: choose another with key=PATH). The one verdict on a directory
    a command writes into: the config checks (hydra.run.dir, eval's out=), eval's report
    directory and `mtrain fit` once more as it claims the run (mtrain.cli.fit)."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"cannot be made: {existing} is a file"
        raise MtrainError(f"{key}: {path} {what}; {advice or _choose_another(key)}")
    if not os.access(existing, os.W_OK | os.X_OK):
        # access(2) answers for root too on a read-only mount (EROFS), where permission bits do not
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = f"{existing} is on a read-only file system" if read_only else f"{existing} denies writing"
        raise not_writable(path, key, why, advice)


def not_writable(path: Path, key: str, why: str, advice: str | None = None) -> MtrainError:
    """The refusal of a directory that cannot be written, `why` saying what stops it (also for an
    OSError met once writing starts: its strerror)."""
    return MtrainError(f"{key}: {path} is not writable ({why}); {advice or _choose_another(key)}")


def _choose_another(key: str) -> str:
    return f"choose another with {key}=PATH"


# ----------------------------------------------------------------------------- decode combinations
MARKUP_FORMATS = ("text", "xml", "html")


def _check_format(fmt: str, key: str) -> None:
    """translate's `format`: text, or markup put back by word alignments (xml, html)."""
    if fmt not in MARKUP_FORMATS:
        raise MtrainError(
            f"{key}: {fmt!r} must be one of {'|'.join(MARKUP_FORMATS)}" + did_you_mean(fmt, MARKUP_FORMATS)
        )


def _refuse_quality_decoding_in_fit(decode: DecodeConfig) -> None:
    """Training validates and tests with the beam; MBR and reranking are decode-time choices."""
    if decode.uses_mbr:
        raise MtrainError(
            f"decode.mbr.candidates: {decode.mbr.candidates} is for mtrain translate, eval and serve; "
            "`mtrain fit` validates and tests with beam search (score the run with mtrain eval decode.mbr...)"
        )
    for key in ("weights", "reverse_run", "second_run"):
        if getattr(decode.rerank, key) is not None:
            raise MtrainError(
                f"decode.rerank.{key}: reranking is for mtrain translate, eval and serve; `mtrain fit` "
                "validates and tests with beam search"
            )


def _check_target_control_files(cfg: TranslateConfig) -> None:
    """translate's prefix=, terms= and avoid=: readable files (what an engine and search can
    honour with them: `_check_combinations`)."""
    for key in ("prefix", "terms", "avoid"):
        path = getattr(cfg, key)
        if path is not None and not Path(str(path)).is_file():
            raise MtrainError(f"{key}={path}: no such file")


def _check_combinations(cfg: DecodingCommandConfig) -> None:
    """What translate, eval and serve ask for beyond decode.*, by the command line's names,
    against what the decode settings and the engine can honour (mtrain.decoding_rules, the
    rules an HTTP request is checked by too)."""
    decode = cfg.decode
    given = {key: getattr(cfg, key, None) for key in ("prefix", "constraints", "terms", "avoid", "attention")}
    constraints = [
        f"{key}={value}"
        for key, value in given.items()
        if key in ("constraints", "terms") and value not in (None, ConstraintOrder.none)
    ]
    fmt = str(getattr(cfg, "format", "text"))
    asked = Asked(
        prefix=f"prefix={given['prefix']}" if given["prefix"] is not None else None,
        constraints=constraints[0] if constraints else None,
        avoid=f"avoid={given['avoid']}" if given["avoid"] is not None else None,
        markup=f"format={fmt}" if fmt != "text" else None,
        alignment=f"decode.alignment={decode.alignment}" if decode.aligns else None,
        pictures=f"attention={given['attention']}" if given["attention"] is not None else None,
    )
    check_decoding(decode, asked, ctranslate2=_decodes_with_ctranslate2(cfg))
