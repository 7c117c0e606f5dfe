"""Value checks of a composed config: the one home of every range and cross-key rule.

OmegaConf checks keys, types and choices while Hydra composes the config (mtrain.config);
what a type cannot say (a beam of 0, a negative learning rate, "2min" as a duration, heads
that do not divide d_model) is checked here. `check_config` runs once at the start of every
command, before any data is read or any file written (mtrain.cli.common), so each bad value
costs one line, `<key>: <why>`, not a traceback after the training budget is spent.
`check_model_config` also guards `build_model` for library callers.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import types
import typing
from collections.abc import Iterator, Sequence
from enum import Enum
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mtrain.config import (
    AlignmentLevel,
    AverageConfig,
    ConstraintOrder,
    DecodeWeights,
    Engine,
    EvalConfig,
    FitConfig,
    MbrCandidates,
    ModelConfig,
    NormPosition,
    Positions,
    Precision,
    ReportConfig,
    ResidualInput,
    Sampling,
    Scheduler,
    ServeConfig,
    TranslateConfig,
    alignment_level,
)
from mtrain.durations import parse_budget_share, parse_duration
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, is_export_dir, training_checkpoint_of


def check_config(cfg: DictConfig) -> None:
    """Raise MtrainError("<key>: <why>") for the first bad value of a command's config."""
    check_known_keys(cfg)
    check_finite(cfg)
    schema = OmegaConf.get_type(cfg)
    if schema is FitConfig:
        _check_fit(cfg)
    elif schema is TranslateConfig:
        _check_decode(cfg.decode, "decode")
        _check_alignment(cfg)
        _check_decoding_precision(cfg)
        _check_engine_sampling(cfg)
        _check_ensemble(cfg)
        _check_translate(cfg)
    elif schema is ServeConfig:
        _check_decode(cfg.decode, "decode")
        _check_alignment(cfg)
        _check_decoding_precision(cfg)
        _check_engine_sampling(cfg)
        _check_serve(cfg)
    elif schema is EvalConfig:
        _check_decode(cfg.decode, "decode")
        _check_alignment(cfg)
        _check_decoding_precision(cfg)
        _check_engine_sampling(cfg)
        _check_ensemble(cfg)
        _at_least(cfg, "average_last", 0)
        _at_least(cfg, "bootstrap_samples", 0)
        _at_least(cfg, "chrf_word_order", 0)
        _optional_at_least(cfg, "num_threads", 1)
        _at_least(cfg, "worst_lines", 0)
        _check_eval_out(cfg)
    elif schema is AverageConfig:
        _at_least(cfg, "last", 1)
        _check_average_out(cfg)
    elif schema is ReportConfig:
        _at_least(cfg, "bootstrap_samples", 0, "(0 leaves the bootstrap columns out)")


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


def check_finite(cfg: Any, prefix: str = "") -> None:
    """Refuse inf and nan in every number of a config, its sections and lists (data.corpora[i],
    train.betas) included: no key means anything by them, and a range check such as `> 0`
    lets inf through (a weight of inf ends in a traceback once the corpora are encoded)."""
    items = enumerate(cfg) if OmegaConf.is_list(cfg) else ((key, cfg[key]) for key in cfg)
    for key, value in items:
        name = f"{prefix}[{key}]" if OmegaConf.is_list(cfg) else f"{prefix}{key}"
        if isinstance(value, float) and not math.isfinite(value):
            raise MtrainError(f"{name}: {value} must be a finite number")
        if OmegaConf.is_list(value):
            check_finite(value, name)
        elif OmegaConf.is_dict(value):
            check_finite(value, f"{name}.")


# Words that name a model's size in a preset's name, smallest first: `transformer_tiny` is
# nearest `transformer_small`, though spelt more like `transformer_big`.
SIZE_WORDS = ("tiny", "small", "base", "medium", "big", "large", "huge")


def did_you_mean(word: str, candidates: Sequence[str], prefix: str = "") -> str:
    """' (did you mean <prefix><closest>?)', or '' when nothing is close. A name that differs
    from candidates only in its size word gets the nearest sizes (`closest_sizes`)."""
    close = closest_sizes(word, candidates) or difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return _suggestion(close, prefix)


def did_you_mean_key(key: str, known: Sequence[str]) -> str:
    """' (did you mean <key>?)' for an unknown dotted config key, or '' when none is close:
    the known keys whose last part is `key`'s (`beam` -> decode.beam, as fairseq habits type
    it; `-` read as `_`, so `max-tokens` -> train.max_tokens), else the closest whole key
    (`train.max_tiem` -> train.max_time), else the keys whose last part is closest (`max_tiem`)."""

    def last_part(name: str) -> str:
        return name.rsplit(".", 1)[-1].replace("-", "_").lower()

    def by_likeness(names: list[str]) -> list[str]:
        return sorted(names, key=lambda name: -difflib.SequenceMatcher(None, key, name).ratio())

    same_last = [name for name in known if last_part(name) == last_part(key) and name != key]
    if same_last:
        return _suggestion(by_likeness(same_last))
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if close:
        return _suggestion(close)
    close_last = difflib.get_close_matches(
        last_part(key), sorted({last_part(name) for name in known}), n=1, cutoff=0.75
    )
    return _suggestion(by_likeness([name for name in known if close_last and last_part(name) == close_last[0]]))


def closest_sizes(word: str, candidates: Sequence[str]) -> list[str]:
    """The candidates that differ from `word` only in a size word (SIZE_WORDS, between `_`, `-`
    or `.`), the nearest size(s) first: `transformer_tiny` -> [transformer_small]; [] when
    `word` has no size word or no candidate differs from it only there."""
    parts = re.split(r"([_.-])", word)
    sized = [i for i, part in enumerate(parts) if part.lower() in SIZE_WORDS]
    if len(sized) != 1:
        return []
    index, size = sized[0], SIZE_WORDS.index(parts[sized[0]].lower())
    distance: dict[str, int] = {}
    for candidate in candidates:
        other = re.split(r"([_.-])", candidate)
        if (
            candidate != word
            and len(other) == len(parts)
            and other[index].lower() in SIZE_WORDS
            and all(a == b for i, (a, b) in enumerate(zip(parts, other, strict=True)) if i != index)
        ):
            distance[candidate] = abs(SIZE_WORDS.index(other[index].lower()) - size)
    nearest = min(distance.values(), default=None)
    return [candidate for candidate, d in distance.items() if d == nearest]


def _suggestion(names: Sequence[str], prefix: str = "", most: int = 3) -> str:
    if not names:
        return ""
    return f" (did you mean {' or '.join(f'{prefix}{name}' for name in names[:most])}?)"


def schema_keys(schema: type, prefix: str = "") -> Iterator[str]:
    """Every dotted key of a config dataclass, nested sections included."""
    for field in dataclasses.fields(schema):
        key = f"{prefix}{field.name}"
        yield key
        field_type = typing.get_type_hints(schema)[field.name]
        if isinstance(field_type, type) and dataclasses.is_dataclass(field_type):
            yield from schema_keys(field_type, f"{key}.")


def takes_a_list(schema: type | None, key: str) -> bool:
    """Whether the dotted `key` of a config dataclass is a list (True when it is not found:
    a list is then the likelier reading of `a,b`)."""
    field_type: Any = schema
    for name in key.split("."):
        if not (dataclasses.is_dataclass(field_type) and name in {f.name for f in dataclasses.fields(field_type)}):
            return True
        field_type = typing.get_type_hints(field_type)[name]
    while typing.get_origin(field_type) in (typing.Union, types.UnionType):  # list[str] | None
        field_type = next(arg for arg in typing.get_args(field_type) if arg is not type(None))
    return typing.get_origin(field_type) in (list, tuple) or field_type in (list, tuple)


def list_item_schema(schema: type | None, key: str) -> type | None:
    """The config dataclass of the items of the list at dotted `key` (CorpusConfig for
    data.corpora of FitConfig); None when `key` is not a list of config dataclasses."""
    field_type: Any = schema
    for name in key.split("."):
        if not (dataclasses.is_dataclass(field_type) and name in {f.name for f in dataclasses.fields(field_type)}):
            return None
        field_type = typing.get_type_hints(field_type)[name]
    if typing.get_origin(field_type) is list:
        item = typing.get_args(field_type)[0]
        return item if isinstance(item, type) and dataclasses.is_dataclass(item) else None
    return None


def check_model_config(cfg: Any, prefix: str = "model") -> None:
    """Raise MtrainError("model.<key>: ...") for the first invalid ModelConfig value."""
    _check_choices(cfg, ModelConfig, prefix)
    for key in ("encoder_layers", "decoder_layers", "d_model", "heads", "ffn_dim", "max_positions", "vocab_multiple"):
        _at_least(cfg, key, 1, prefix=prefix)
    _optional_at_least(cfg, "layers", 1, prefix=prefix)
    for key in ("dropout", "attention_dropout", "activation_dropout"):
        _fraction(cfg, key, prefix)
    if cfg.residual_input == ResidualInput.normalized and cfg.norm_position != NormPosition.pre:
        raise MtrainError(
            f"{prefix}.residual_input: normalized needs {prefix}.norm_position=pre (post-norm's stream is "
            "normalised after every sublayer already)"
        )
    if cfg.d_model % cfg.heads:
        raise MtrainError(f"{prefix}.heads: {cfg.heads} does not divide {prefix}.d_model={cfg.d_model}")
    if cfg.positions == Positions.rope and (cfg.d_model // cfg.heads) % 2:
        raise MtrainError(
            f"{prefix}.positions: rope needs an even head size, got d_model/heads = {cfg.d_model // cfg.heads}"
        )


# ----------------------------------------------------------------------------- per command
def _check_fit(cfg: DictConfig) -> None:
    if not 0 <= cfg.seed < 2**32:
        raise MtrainError(f"seed: {cfg.seed} must be in [0, 2**32) (numpy's seed range)")
    _check_data(cfg.data)
    _check_tokenizer(cfg.tokenizer)
    check_corpora(cfg.data, cfg.tokenizer)
    check_model_config(cfg.model)
    _check_train(cfg.train)
    _check_guided_alignment(cfg)
    _check_decode(cfg.decode, "decode")
    _at_least(cfg.decode, "valid_beam", 1, prefix="decode")
    _refuse_quality_decoding_in_fit(cfg.decode)
    _check_init(cfg)


def _check_guided_alignment(cfg: DictConfig) -> None:
    """train.guided_alignment: one training corpus, read as it is segmented (the file's lines
    are its lines and its words the pieces' words), and a head the model has."""
    train = cfg.train
    if train.guided_alignment is None:
        return
    if not Path(train.guided_alignment).is_file():
        raise MtrainError(
            f"train.guided_alignment: {train.guided_alignment} is not a file (Pharaoh word alignments of "
            "the training corpus, e.g. from scripts/align_eflomal.py)"
        )
    if cfg.data.corpora:
        raise MtrainError(
            "train.guided_alignment: with data.corpora the file's lines match no one corpus; "
            "train guided alignment on a single corpus (data=...)"
        )
    if cfg.data.subword_sampling.alpha > 0:
        raise MtrainError("train.guided_alignment: not with data.subword_sampling (sampled copies); switch one off")
    if cfg.data.lang_tags:
        raise MtrainError("train.guided_alignment: not with data.lang_tags (tagged sources); switch one off")
    if not train.guided_alignment_weight >= 0:
        raise MtrainError(f"train.guided_alignment_weight: {train.guided_alignment_weight} must be >= 0")
    model = cfg.model
    layers = model.decoder_layers if model.layers is None else model.layers
    if not -layers <= train.guided_alignment_layer < layers:
        raise MtrainError(
            f"train.guided_alignment_layer: {train.guided_alignment_layer} is not a layer of the "
            f"{layers}-layer decoder (0..{layers - 1}, or negative from the last)"
        )
    if not -model.heads <= train.guided_alignment_head < model.heads:
        raise MtrainError(
            f"train.guided_alignment_head: {train.guided_alignment_head} is not one of the "
            f"{model.heads} heads (0..{model.heads - 1})"
        )


def _check_init(cfg: DictConfig) -> None:
    """init_from names an existing run directory or checkpoint (what it holds is checked when the
    run starts: mtrain.train.init_from); init_weights and init_keep_optimizer need it; a given
    tokenizer.path exists and does not contradict the parent's tokenizer."""
    path = cfg.tokenizer.path
    # (a resumed run encodes with its own copy in the run directory: the origin may be gone)
    if path is not None and not cfg.train.resume and not Path(str(path)).expanduser().is_dir():
        raise MtrainError(
            f"tokenizer.path: {path!r}: no such directory (a run directory, its tokenizer/ or a cache entry)"
        )
    if cfg.init_from is None:
        if cfg.init_keep_optimizer:
            raise MtrainError(
                "init_keep_optimizer: true needs init_from=RUN_DIR|CHECKPOINT, the run whose "
                "optimiser state to keep (a resume keeps its own: train.resume=true)"
            )
        if cfg.init_weights != DecodeWeights.auto:
            raise MtrainError(
                f"init_weights: {cfg.init_weights} chooses the weights of init_from=RUN_DIR|CHECKPOINT, "
                "which is not set"
            )
        return
    hub_id = re.fullmatch(r"[\w.-]+/[\w.-]+", str(cfg.init_from)) is not None  # a Hugging Face model on the hub
    if not str(cfg.init_from).strip() or not (Path(str(cfg.init_from)).expanduser().exists() or hub_id):
        raise MtrainError(f"init_from: {cfg.init_from!r}: no such run directory, checkpoint file or model directory")
    if path is not None:
        raise MtrainError(
            f"tokenizer.path={path}: a fine-tune encodes with its parent's tokenizer (init_from="
            f"{cfg.init_from}); drop tokenizer.path"
        )


def _check_data(data: DictConfig) -> None:
    _optional_at_least(data, "train_limit", 1, prefix="data")
    _at_least(data, "num_workers", 1, prefix="data")
    _at_least(data, "chunk_size", 1, prefix="data")
    if len(data.corpora) > 1 and data.subword_sampling.alpha > 0:
        raise MtrainError(
            "data.subword_sampling.alpha: subword sampling trains on one corpus; with several data.corpora set it to 0"
        )
    _at_least(data.clean, "max_len", 1, prefix="data.clean")
    _at_least(data.clean, "min_len", 0, prefix="data.clean")
    if data.clean.min_len > data.clean.max_len:
        raise MtrainError(f"data.clean.min_len: {data.clean.min_len} is above data.clean.max_len={data.clean.max_len}")
    _at_least(data.clean, "max_len_ratio", 1.0, prefix="data.clean", why="(the longer side over the shorter)")


# SentencePiece's own pieces: a tag must not be one of them.
SPECIAL_PIECES = ("<unk>", "<s>", "</s>", "<pad>")


def check_corpora(data: Any, tokenizer: Any) -> None:
    """data.corpora, data.sampling_temperature, data.lang_tags and the tags against the
    tokenizer: a config node or the dataclasses (`prepare_data` checks library callers too)."""
    if not (math.isfinite(data.sampling_temperature) and data.sampling_temperature > 0):
        raise MtrainError(
            f"data.sampling_temperature: {data.sampling_temperature} must be > 0 and finite (1: draw "
            "in proportion to size times weight; larger: flatter, e.g. 100 for nearly uniform)"
        )
    lang_symbols = {f"<2{corpus.tgt or data.tgt}>" for corpus in data.corpora} | {f"<2{data.tgt}>"}
    directions = []
    for index, corpus in enumerate(data.corpora):
        key = f"data.corpora[{index}]"
        if not (math.isfinite(corpus.weight) and corpus.weight > 0):
            raise MtrainError(f"{key}.weight: {corpus.weight} must be > 0 and finite (its share of the training draw)")
        if corpus.train_limit is not None and corpus.train_limit < 1:
            raise MtrainError(f"{key}.train_limit: {corpus.train_limit} must be >= 1 (or null: data.train_limit)")
        src, tgt = corpus.src or data.src, corpus.tgt or data.tgt
        if src == tgt:
            raise MtrainError(
                f"{key}.tgt: '{tgt}' is also its source language ({key}.src or data.src); "
                "a corpus translates between two languages"
            )
        if (src, tgt) not in directions:
            directions.append((src, tgt))
        if corpus.tag is not None:
            symbol = f"<{corpus.tag}>"
            if not corpus.tag or any(character.isspace() or character in "<>" for character in corpus.tag):
                raise MtrainError(
                    f"{key}.tag: {corpus.tag!r} must be a non-empty name without spaces or "
                    "angle brackets (e.g. bt: the symbol <bt>)"
                )
            if symbol in SPECIAL_PIECES:
                raise MtrainError(
                    f"{key}.tag: {corpus.tag!r} makes {symbol}, a special piece of the tokenizer; "
                    "choose another name (e.g. bt)"
                )
            if data.lang_tags and symbol in lang_symbols:
                raise MtrainError(
                    f"{key}.tag: {symbol} is also a target-language tag (data.lang_tags=true); choose another name"
                )
    ambiguous = source_with_several_targets(directions)
    if ambiguous is not None and not data.lang_tags:
        src, targets = ambiguous
        raise MtrainError(
            f"data.lang_tags: false, but data.corpora translates {src} into {' and '.join(targets)}: without "
            "a target-language tag the model cannot know which to write; set data.lang_tags=true (with "
            "tokenizer.joint=true)"
        )
    if data.lang_tags and not tokenizer.joint:
        raise MtrainError(
            "data.lang_tags: the language tags need one vocabulary for all languages; set tokenizer.joint=true"
        )
    if len(directions) > 1 and not tokenizer.joint:
        names = ", ".join(f"{src}-{tgt}" for src, tgt in directions)
        raise MtrainError(
            f"tokenizer.joint: false, but data.corpora trains {len(directions)} directions ({names}); "
            "several directions need tokenizer.joint=true"
        )
    tagged = data.lang_tags or any(corpus.tag for corpus in data.corpora)
    if data.subword_sampling.alpha > 0 and (len(data.corpora) > 1 or tagged):
        raise MtrainError(
            "data.subword_sampling.alpha: subword sampling works on one untagged training corpus; "
            "set it to 0 with several data.corpora, a corpus tag or data.lang_tags"
        )


def source_with_several_targets(directions: Sequence[tuple[str, str]]) -> tuple[str, list[str]] | None:
    """The first source language that `directions` translate into more than one language, with
    those languages; None when each source has one target. Without data.lang_tags such a run
    has nothing to tell it which of them to write."""
    for src, _ in directions:
        targets = [tgt for source, tgt in directions if source == src]
        if len(targets) > 1:
            return src, targets
    return None


def _check_tokenizer(tokenizer: DictConfig) -> None:
    _at_least(tokenizer, "max_sentences", 1, prefix="tokenizer")
    _at_least(tokenizer, "num_threads", 1, prefix="tokenizer")
    if not 0.0 < tokenizer.character_coverage <= 1.0:
        raise MtrainError(f"tokenizer.character_coverage: {tokenizer.character_coverage} must be in (0, 1]")
    special = {name: getattr(tokenizer, name) for name in ("unk_id", "pad_id", "bos_id", "eos_id")}
    _at_least(
        tokenizer,
        "vocab_size",
        len(special) + 1,
        prefix="tokenizer",
        why="(room for unk, pad, bos, eos and at least one piece)",
    )
    for name, value in special.items():
        if not 0 <= value < tokenizer.vocab_size:
            raise MtrainError(f"tokenizer.{name}: {value} must be in [0, tokenizer.vocab_size={tokenizer.vocab_size})")
    if len(set(special.values())) < len(special):
        raise MtrainError(f"tokenizer.unk_id/pad_id/bos_id/eos_id: {list(special.values())} must be four different ids")


def _check_train(train: DictConfig) -> None:
    for key in (
        "max_tokens",
        "update_freq",
        "validate_every",
        "log_every",
        "keep_last",
        "max_bad_updates",
        "max_oom_batches",
        "instrument_every",
    ):
        _at_least(train, key, 1, prefix="train")
    for key in (
        "decay_updates",
        "max_updates",
        "max_epochs",
        "patience",
        "num_threads",
        "decode_num_threads",
        "valid_max_sentences",
        "pad_to_multiple",
    ):
        _optional_at_least(train, key, 1, prefix="train")
    for key in ("warmup_updates", "weight_decay", "clip_norm", "min_lr", "ema_start_update"):
        _at_least(train, key, 0, prefix="train")
    _optional_at_least(train, "shape_buckets", 0, prefix="train")
    if train.cuda_graphs and train.shape_buckets == 0:
        raise MtrainError(
            "train.cuda_graphs: a CUDA graph is recorded for every batch shape, and train.shape_buckets=0 "
            "leaves their number unbounded; set train.shape_buckets (e.g. 8) or leave it null"
        )
    if train.ema_decay is not None and not 0.0 < train.ema_decay < 1.0:
        raise MtrainError(f"train.ema_decay: {train.ema_decay} must be in (0, 1), e.g. 0.999, or null for none")
    if not train.lr > 0:
        raise MtrainError(f"train.lr: {train.lr} must be > 0")
    if train.min_lr > train.lr:
        raise MtrainError(f"train.min_lr: {train.min_lr} is above train.lr={train.lr}")
    if not train.eps > 0:
        raise MtrainError(f"train.eps: {train.eps} must be > 0")
    if len(train.betas) != 2 or not all(0.0 <= beta < 1.0 for beta in train.betas):
        raise MtrainError(f"train.betas: {list(train.betas)} must be two numbers in [0, 1), e.g. [0.9,0.98]")
    _fraction(train, "label_smoothing", "train")
    for key in ("max_time", "max_train_time"):
        try:
            seconds = parse_duration(train[key], f"train.{key}")
        except MtrainError:
            raise MtrainError(f"train.{key}: {train[key]!r} is not a duration; write e.g. 90s, 20m or 2h") from None
        if seconds is not None and seconds <= 0:
            raise MtrainError(f"train.{key}: {train[key]!r} must be a positive duration, e.g. 90s, 20m or 2h")
    for key in ("validate_every_time", "save_every", "log_every_time"):
        _positive_duration(train, key, "train")
    # A duration of warmup must be shorter than the training time; max_time's training share is
    # only known at the start of training, so its whole is the bound here.
    budget_key = "max_train_time" if train.max_train_time is not None else "max_time"
    try:
        share = parse_budget_share(train.warmup_time, train[budget_key], "train.warmup_time")
    except MtrainError:
        share = -1.0
    if share is not None and not 0.0 <= share < 1.0:
        raise MtrainError(
            f"train.warmup_time: {train.warmup_time!r} must be a share of the training time from 0% to "
            f"below 100% (e.g. 9%) or a duration shorter than train.{budget_key}={train[budget_key]}"
        )
    if (
        train.scheduler in (Scheduler.cosine, Scheduler.linear)
        and train.decay_updates is None
        and train.max_time is None
        and train.max_train_time is None
        and train.max_updates is None
    ):
        raise MtrainError(
            f"train.scheduler: {train.scheduler} needs a horizon: set train.decay_updates, "
            "train.max_updates, train.max_time or train.max_train_time"
        )


def _check_decode(decode: DictConfig, prefix: str) -> None:
    for key in ("beam", "nbest", "max_tokens"):
        _at_least(decode, key, 1, prefix=prefix)
    for key in ("max_len_a", "max_len_b", "min_len", "no_repeat_ngram", "seed"):
        _at_least(decode, key, 0, prefix=prefix)
    if decode.max_len_a == 0 and decode.max_len_b == 0:
        raise MtrainError(f"{prefix}.max_len_a/max_len_b: both 0 allow no output token (max length = a * source + b)")
    if not 0.0 <= decode.epsilon < 1.0:
        raise MtrainError(f"{prefix}.epsilon: {decode.epsilon} must be in [0, 1) (0 samples from the whole vocabulary)")
    _check_mbr(decode, prefix)
    if decode.mbr.candidates != MbrCandidates.none:
        return  # the beam and nbest of the candidates are MBR's (mtrain.decode.mbr)
    if decode.sampling == Sampling.none:
        if decode.nbest > decode.beam:
            raise MtrainError(
                f"{prefix}.nbest: {decode.nbest} is above {prefix}.beam={decode.beam} (beam search "
                f"keeps only `beam` hypotheses); raise {prefix}.beam"
            )
        return
    if not decode.temperature > 0:
        raise MtrainError(f"{prefix}.temperature: {decode.temperature} must be > 0")
    if decode.sampling == Sampling.topk:
        _at_least(decode, "top_k", 0, prefix=prefix, why="(0 samples from the whole vocabulary)")
    if decode.sampling == Sampling.topp and not 0.0 < decode.top_p <= 1.0:
        raise MtrainError(f"{prefix}.top_p: {decode.top_p} must be in (0, 1]")


def _check_alignment(cfg: DictConfig) -> None:
    """decode.alignment's value, and what CTranslate2 can give: the last layer's heads
    averaged (the alignment layer `mtrain export` writes), nothing else."""
    if alignment_level(cfg.decode.alignment) is AlignmentLevel.none:
        return
    if cfg.decode.mbr.candidates != MbrCandidates.none:
        raise MtrainError(
            f"decode.alignment={cfg.decode.alignment}: MBR decoding (decode.mbr.candidates="
            f"{cfg.decode.mbr.candidates}) keeps no attention to align with; use beam search for alignments"
        )
    exported = cfg.run is not None and is_export_dir(str(cfg.run))
    layer, head = cfg.decode.alignment_layer, cfg.decode.alignment_head
    if (cfg.engine == Engine.ctranslate2 or exported) and (layer not in (None, -1) or head is not None):
        raise MtrainError(
            f"decode.alignment_layer={_null(layer)} alignment_head={_null(head)}: CTranslate2 gives the last layer's "
            "attention averaged over heads only; leave both unset (or layer -1), or use engine=torch"
        )


MARKUP_FORMATS = ("text", "xml", "html")


def _check_format(fmt: str, decode: DictConfig, key: str) -> None:
    """translate's `format` (serve's request field): text, or markup put back by word alignments."""
    if fmt not in MARKUP_FORMATS:
        raise MtrainError(
            f"{key}: {fmt!r} must be one of {'|'.join(MARKUP_FORMATS)}" + did_you_mean(fmt, MARKUP_FORMATS)
        )
    if fmt != "text" and alignment_level(decode.alignment) is AlignmentLevel.subword:
        raise MtrainError(
            f"{key}={fmt} puts tags back by word alignments; decode.alignment=subword would print other "
            "links than it uses: use decode.alignment=word (or false)"
        )


def _null(value: Any) -> str:
    return "null" if value is None else str(value)


def _check_mbr(decode: DictConfig, prefix: str) -> None:
    """MBR decoding's counts (mtrain.decode.mbr); the reranking files are checked when a
    command starts (mtrain.decode.rerank.check_rerank_files), before any model loads."""
    mbr = decode.mbr
    _at_least(mbr, "num_candidates", 1, prefix=f"{prefix}.mbr")
    _optional_at_least(mbr, "num_pseudo_refs", 1, prefix=f"{prefix}.mbr")
    if mbr.candidates != MbrCandidates.none and decode.nbest > mbr.num_candidates:
        raise MtrainError(
            f"{prefix}.nbest: {decode.nbest} is above {prefix}.mbr.num_candidates={mbr.num_candidates} "
            f"(MBR ranks only its candidates); raise {prefix}.mbr.num_candidates"
        )


def _refuse_quality_decoding_in_fit(decode: DictConfig) -> None:
    """Training validates and tests with the beam; MBR and reranking are decode-time choices."""
    if decode.mbr.candidates != MbrCandidates.none:
        raise MtrainError(
            f"decode.mbr.candidates: {decode.mbr.candidates} is for mtrain translate, eval and serve; "
            "`mtrain fit` validates and tests with beam search (score the run with mtrain eval decode.mbr...)"
        )
    for key in ("weights", "reverse_run", "second_run"):
        if decode.rerank[key] is not None:
            raise MtrainError(
                f"decode.rerank.{key}: reranking is for mtrain translate, eval and serve; `mtrain fit` "
                "validates and tests with beam search"
            )


def _check_engine_sampling(cfg: DictConfig) -> None:
    """CTranslate2 samples with top-k, top-p and temperature only: no epsilon cut."""
    exported = cfg.run is not None and is_export_dir(str(cfg.run))
    if cfg.engine != Engine.ctranslate2 and not exported:
        return
    decode = cfg.decode
    mbr_samples = decode.mbr.candidates in (MbrCandidates.sample, MbrCandidates.both) or (
        decode.mbr.candidates != MbrCandidates.none and decode.mbr.num_pseudo_refs is not None
    )
    if decode.sampling == Sampling.epsilon or (mbr_samples and decode.sampling == Sampling.none):
        raise MtrainError(
            "decode.sampling: CTranslate2 has no epsilon sampling (MBR's samples use it when decode.sampling=none); "
            "with engine=ctranslate2 use decode.sampling=topp or topk, or decode with engine=torch"
        )


def _check_decoding_precision(cfg: DictConfig) -> None:
    """`precision` of translate/eval/serve: mtrain's precisions with engine=torch (CTranslate2,
    and so an `mtrain export` directory as run=, also takes its compute types, checked by
    mtrain.decode.ct2_engine)."""
    allowed = [member.value for member in Precision]
    exported = cfg.run is not None and is_export_dir(str(cfg.run))  # CTranslate2 decodes it, whatever engine says
    if cfg.engine == Engine.torch and cfg.precision not in allowed and not exported:
        raise MtrainError(
            f"precision: {cfg.precision!r} is not one of {'|'.join(allowed)} with engine=torch"
            + did_you_mean(str(cfg.precision), allowed)
        )


def _check_ensemble(cfg: DictConfig) -> None:
    """`ensemble=` of translate/eval: the torch engine's, decoding with run=; eval's report of an
    ensemble goes to out=DIR, never into run='s eval/ (where it would pass for run='s own score)."""
    if not cfg.ensemble:
        return
    if cfg.engine != Engine.torch:
        raise MtrainError("ensemble: engine=ctranslate2 decodes one model; decode an ensemble with engine=torch")
    is_eval = OmegaConf.get_type(cfg) is EvalConfig
    if not (cfg.run or (is_eval and (cfg.runs or cfg.hyp))):
        first, others = cfg.ensemble[0], ",".join(cfg.ensemble[1:])
        raise MtrainError(
            "ensemble: decodes with run= (its tokenizer) and the members, and run= is missing: an ensemble "
            f"is written run=A ensemble=[B,...], here run={first}" + (f" ensemble=[{others}]" if others else "")
        )
    if not is_eval:
        return
    if cfg.runs or cfg.hyp:
        raise MtrainError(
            "ensemble: decodes with run=RUN's model; hyp= and runs= decode nothing "
            "(drop ensemble=, or evaluate a run with run=RUN)"
        )
    if cfg.out is None:
        raise MtrainError(
            f"ensemble: the report of an ensemble is not run={cfg.run}'s own; "
            "give out=DIR to write it (and any average_last checkpoint) there"
        )


def _check_translate(cfg: DictConfig) -> None:
    _at_least(cfg, "max_input_tokens", 2, why="(one token and eos)")
    _check_format(str(cfg.format), cfg.decode, "format")
    _optional_at_least(cfg, "num_threads", 1)
    layer = str(cfg.attention_layer)
    if layer not in ("last", "all") and not layer.lstrip("-").isdigit():
        raise MtrainError(f"attention_layer: {layer!r} must be last, all or a layer index")
    if cfg.output is not None:
        check_writable_file(Path(cfg.output), "output")
    _check_target_controls(cfg)
    _check_selection_with_controls(cfg)


def _check_selection_with_controls(cfg: DictConfig) -> None:
    """MBR draws and ranks its own candidates and reranking reorders the n-best by features
    that know nothing of a forced prefix or required phrases (mtrain.decode.selection): not
    combined with translate's controls, nor MBR with markup, whose tags follow the alignments."""
    decode = cfg.decode
    selection = (
        "decode.mbr.candidates"
        if decode.mbr.candidates != MbrCandidates.none
        else "decode.rerank.weights"
        if decode.rerank.weights is not None
        else None
    )
    if selection is None:
        return
    controls = [
        f"{key}={cfg.get(key)}"
        for key in ("prefix", "constraints", "terms", "avoid")
        if cfg.get(key) not in (None, ConstraintOrder.none)
    ]
    if str(cfg.format) != "text" and selection == "decode.mbr.candidates":
        controls.append(f"format={cfg.format}")
    if controls:
        raise MtrainError(
            f"{controls[0]}: {selection} (MBR or reranking) does not take prefixes, constraints, terms, avoided "
            "phrases or markup; decode them with beam search"
        )


def _check_target_controls(cfg: DictConfig) -> None:
    """translate's prefix=, constraints=, terms= and avoid=: readable files, and an engine and
    search that can honour them (CTranslate2 has prefixes and avoided phrases, not constraints;
    constraints need beam search)."""
    for key in ("prefix", "terms", "avoid"):
        path = cfg.get(key)
        if path is not None and not Path(str(path)).is_file():
            raise MtrainError(f"{key}={path}: no such file")
    constrained = [
        f"{key}={cfg.get(key)}" for key in ("constraints", "terms") if cfg.get(key) not in (None, ConstraintOrder.none)
    ]
    if not constrained:
        return
    exported = cfg.run is not None and is_export_dir(str(cfg.run))
    if cfg.engine != Engine.torch or exported:
        raise MtrainError(
            f"{constrained[0]}: CTranslate2 has no lexical constraints (only prefix= and avoid=); use engine=torch"
            + (" with a run directory of `mtrain fit`" if exported else "")
        )
    if cfg.decode.sampling != Sampling.none:
        raise MtrainError(f"{constrained[0]}: lexical constraints need beam search; drop decode.sampling")


def _check_average_out(cfg: DictConfig) -> None:
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


def _check_serve(cfg: DictConfig) -> None:
    _at_least(cfg, "max_input_tokens", 2, why="(one token and eos)")
    _optional_at_least(cfg, "num_threads", 1)
    if not 0 <= cfg.port <= 65535:
        raise MtrainError(f"port: {cfg.port} must be in 0..65535 (0: any free port)")
    for key in (
        "max_batch_sentences",
        "max_request_bytes",
        "max_sentences",
        "max_sentence_chars",
        "max_beam",
        "max_connections",
    ):
        _at_least(cfg, key, 1)
    _at_least(cfg, "max_wait_ms", 0)
    for key in ("request_timeout_s", "read_timeout_s"):
        if not cfg[key] > 0:
            raise MtrainError(f"{key}: {cfg[key]} must be > 0")
    for key in ("beam", "nbest"):
        if cfg.decode[key] > cfg.max_beam:
            raise MtrainError(
                f"max_beam: {cfg.max_beam} is below decode.{key}={cfg.decode[key]}, the default of "
                f"every request; raise max_beam or lower decode.{key}"
            )
    _at_least(cfg, "rate_limit_per_minute", 0)
    if cfg.api_keys_file is not None and not Path(cfg.api_keys_file).is_file():
        raise MtrainError(f"api_keys_file: {cfg.api_keys_file} is not a file (one API key per line)")


# ----------------------------------------------------------------------------- paths
def check_writable_file(path: Path, key: str) -> None:
    """A file `path` can be created or replaced (its directory exists and is writable)."""
    if path.is_dir():
        raise MtrainError(f"{key}: {path} is a directory; give a file name")
    directory = path.parent
    if not directory.is_dir():
        raise MtrainError(f"{key}: {path}: the directory {directory} does not exist")
    if not os.access(directory, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise MtrainError(f"{key}: {path} is not writable; choose another path")


def _check_eval_out(cfg: DictConfig) -> None:
    """`out=` is where `run=` writes, and `hyp= per_sentence=true` its TSV: the other modes
    write nothing, so it would be ignored. `runs=` has no per-sentence scores."""
    if cfg.per_sentence and cfg.runs:
        raise MtrainError(
            "per_sentence: scores the lines of one run (run=) or file (hyp=), not a comparison "
            "(runs=); evaluate each run with run=RUN per_sentence=true"
        )
    if cfg.out is None:
        return
    if cfg.runs or (cfg.hyp and not cfg.per_sentence) or not (cfg.run or cfg.hyp):
        raise MtrainError(
            "out: is where `mtrain eval run=RUN` writes its report (and hyp= per_sentence=true its "
            "sentence scores); hyp= alone and runs= write none (drop out=, or evaluate a run with "
            "run=RUN)"
        )
    check_writable_dir(Path(cfg.out), "out")


def check_writable_dir(path: Path, key: str, advice: str | None = None) -> None:
    """A directory `path` exists and is writable, or can be created; else MtrainError naming
    `key`, with `advice` (default: choose another with key=PATH)."""
    advice = advice or f"choose another with {key}=PATH"
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == path else f"cannot be made: {existing} is a file"
        raise MtrainError(f"{key}: {path} {what}; {advice}")
    if not os.access(existing, os.W_OK | os.X_OK):
        # access(2) answers for root too on a read-only mount (EROFS), where permission bits do not
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = f"{existing} is on a read-only file system" if read_only else f"{existing} denies writing"
        raise MtrainError(f"{key}: {path} is not writable ({why}); {advice}")


# ----------------------------------------------------------------------------- helpers
def _key(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _at_least(section: Any, key: str, minimum: float, why: str = "", prefix: str = "") -> None:
    value = getattr(section, key)
    if value < minimum:
        raise MtrainError(f"{_key(prefix, key)}: {value} must be >= {minimum}" + (f" {why}" if why else ""))


def _optional_at_least(section: Any, key: str, minimum: float, prefix: str = "") -> None:
    value = getattr(section, key)
    if value is not None and value < minimum:
        raise MtrainError(f"{_key(prefix, key)}: {value} must be >= {minimum} (or null)")


def _positive_duration(section: Any, key: str, prefix: str) -> None:
    value = getattr(section, key)
    try:
        seconds = parse_duration(value, _key(prefix, key))
    except MtrainError:
        seconds = -1.0
    if seconds is not None and seconds <= 0:
        raise MtrainError(f"{_key(prefix, key)}: {value!r} must be a positive duration, e.g. 90s, 20m or 2h (or null)")


def _fraction(section: Any, key: str, prefix: str) -> None:
    value = getattr(section, key)
    if not 0.0 <= value < 1.0:
        raise MtrainError(f"{_key(prefix, key)}: {value} must be in [0, 1)")


def _check_choices(section: Any, schema: type, prefix: str) -> None:
    """Choice fields hold one of their values. OmegaConf enforces this for a composed config;
    a dataclass built in code (a library caller, a test) is checked here."""
    for name, field_type in typing.get_type_hints(schema).items():
        choice = _choice_type(field_type)
        value = getattr(section, name)
        if choice is not None and value is not None and value not in {member.value for member in choice}:
            allowed = "|".join(member.value for member in choice)
            raise MtrainError(
                f"{prefix}.{name}: {value!r} is not one of {allowed}"
                + did_you_mean(str(value), [member.value for member in choice])
            )


def _choice_type(field_type: Any) -> type[Enum] | None:
    for candidate in (field_type, *typing.get_args(field_type)):  # Optional[X] is Union[X, None]
        if isinstance(candidate, type) and issubclass(candidate, Enum):
            return candidate
    return None
