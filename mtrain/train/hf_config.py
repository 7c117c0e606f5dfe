"""A Hugging Face model's config.json, checked against a schema, and the host memory its model takes.

transformers' config classes fill a missing key with a default and keep whatever JSON value a
key holds (`"d_model": 32.7`, `"scale_embedding": "no"`): a model built from such a file fails
deep inside torch, or silently differs from the one published, or (`encoder_layers:
1000000000`) grows without bound. `read_config` gives the keys `init_from=` reads (MarianMTModel,
mtrain's Pegasus export: mtrain.train.hf_parent) as typed values or refuses the first bad one in
one line naming the file and the key; `check_memory` refuses a model whose weights cannot be
held in this machine's memory before one tensor of it is allocated, naming the keys that make
it large.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtrain.errors import MtrainError
from mtrain.train.host_memory import available_host_memory

# Bytes per parameter while a model is imported: its float32 weights as read from the file and
# again in the model built from them (docs/FINETUNE.md measured a peak of 3.4x the weights, so
# this is a floor: a model refused for it cannot be imported at all).
IMPORT_BYTES_PER_PARAMETER = 8
_REQUIRED = object()


@dataclass(frozen=True)
class HfConfig:
    """The keys of config.json that init_from reads, typed (None: not given)."""

    d_model: int
    encoder_layers: int
    decoder_layers: int
    encoder_attention_heads: int
    decoder_attention_heads: int
    encoder_ffn_dim: int
    decoder_ffn_dim: int
    vocab_size: int
    max_position_embeddings: int
    activation_function: str
    decoder_vocab_size: int | None  # separate vocabularies: the target's
    dropout: float
    attention_dropout: float
    activation_dropout: float
    scale_embedding: bool
    share_encoder_decoder_embeddings: bool
    tie_word_embeddings: bool
    pad_token_id: int | None
    eos_token_id: int | list[int] | None  # transformers allows a list of them
    decoder_start_token_id: int | None
    architectures: list[str] | None
    model_type: str | None

    @property
    def target_vocab_size(self) -> int:
        return self.decoder_vocab_size or self.vocab_size


# key -> (what its value must be, its default; _REQUIRED: the model cannot be built without it)
_SCHEMA: dict[str, tuple[str, Any]] = {
    "d_model": ("count", _REQUIRED),
    "encoder_layers": ("count", _REQUIRED),
    "decoder_layers": ("count", _REQUIRED),
    "encoder_attention_heads": ("count", _REQUIRED),
    "decoder_attention_heads": ("count", _REQUIRED),
    "encoder_ffn_dim": ("count", _REQUIRED),
    "decoder_ffn_dim": ("count", _REQUIRED),
    "vocab_size": ("count", _REQUIRED),
    "max_position_embeddings": ("count", _REQUIRED),
    "activation_function": ("name", _REQUIRED),
    "decoder_vocab_size": ("count", None),
    "dropout": ("fraction", 0.1),
    "attention_dropout": ("fraction", 0.0),
    "activation_dropout": ("fraction", 0.0),
    "scale_embedding": ("flag", False),
    "share_encoder_decoder_embeddings": ("flag", True),
    "tie_word_embeddings": ("flag", True),
    "pad_token_id": ("id", None),
    "eos_token_id": ("ids", None),
    "decoder_start_token_id": ("id", None),
    "architectures": ("names", None),
    "model_type": ("name", None),
}
_WANTED = {
    "count": "a whole number of at least 1 (a JSON integer)",
    "id": "a token id: a whole number of at least 0 (a JSON integer)",
    "ids": "a token id (a JSON integer of at least 0) or a list of them",
    "fraction": "a number in [0, 1)",
    "flag": "true or false",
    "name": "a string",
    "names": "a list of strings",
}


def read_config(path: Path, source: str) -> HfConfig:
    """config.json at `path`, checked key by key (see the module docstring)."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise MtrainError(
            f"{source}: {path} is not readable JSON ({error}); a Hugging Face model's config.json "
            "holds one JSON object (save the model with save_pretrained)"
        ) from error
    if not isinstance(config, dict):
        raise MtrainError(f"{source}: {path} holds a JSON {type(config).__name__}, not the object a config.json holds")
    values = {}
    for key, (kind, default) in _SCHEMA.items():
        if key not in config or (config[key] is None and default is not _REQUIRED):
            if default is _REQUIRED:
                raise MtrainError(
                    f"{source}: {path} has no {key}, which the model's shape needs; it is not a complete "
                    "MarianMTModel/Pegasus config (save the model with save_pretrained)"
                )
            values[key] = default
            continue
        value = config[key]
        if not _holds(kind, value):
            raise MtrainError(f"{source}: {path}'s {key}={json.dumps(value)} must be {_WANTED[kind]}")
        values[key] = value
    hf_config = HfConfig(**values)
    for stack in ("encoder", "decoder"):  # (a value shared by both stacks is checked in hf_parent)
        heads = getattr(hf_config, f"{stack}_attention_heads")
        if hf_config.d_model % heads:
            raise MtrainError(
                f"{source}: {path}'s {stack}_attention_heads={heads} does not divide d_model={hf_config.d_model}"
            )
    return hf_config


def _holds(kind: str, value: Any) -> bool:
    whole = isinstance(value, int) and not isinstance(value, bool)  # JSON's true is Python's 1
    if kind == "count":
        return whole and value >= 1
    if kind == "id":
        return whole and value >= 0
    if kind == "ids":
        return _holds("id", value) or (isinstance(value, list) and bool(value) and all(_holds("id", v) for v in value))
    if kind == "fraction":
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and math.isfinite(value) and 0 <= value < 1
    if kind == "flag":
        return isinstance(value, bool)
    if kind == "name":
        return isinstance(value, str)
    return isinstance(value, list) and all(isinstance(v, str) for v in value)  # names


# ----------------------------------------------------------------------------- memory
def parameter_groups(config: HfConfig) -> list[tuple[str, int]]:
    """(what, how many parameters) for the model `config` describes, each part named by the
    config.json keys that size it: mtrain's layers hold transformers' matrices and biases."""
    d = config.d_model
    vocabularies = config.vocab_size + (0 if config.share_encoder_decoder_embeddings else config.target_vocab_size)
    vocabulary_keys = "vocab_size" if config.share_encoder_decoder_embeddings else "vocab_size + decoder_vocab_size"
    groups = [
        (f"the embeddings ({vocabulary_keys} x d_model)", vocabularies * d + config.target_vocab_size),
        (
            "the position tables (max_position_embeddings x d_model, one per stack)",
            2 * config.max_position_embeddings * d,
        ),
    ]
    for stack, attentions in (("encoder", 1), ("decoder", 2)):  # the decoder's self- and cross-attention
        layers, ffn = getattr(config, f"{stack}_layers"), getattr(config, f"{stack}_ffn_dim")
        attention = attentions * (4 * d * d + 4 * d) + (attentions + 1) * 2 * d  # q, k, v, out; a norm each
        feed_forward = 2 * d * ffn + ffn + d  # fc1 and fc2
        groups.append(
            (f"the {stack}'s layers ({stack}_layers x d_model x {stack}_ffn_dim)", layers * (attention + feed_forward))
        )
    return groups


def check_memory(config: HfConfig, path: Path, source: str, available: int | None = None) -> int:
    """The parameters of `config`'s model; refused in one line when importing it needs more host
    memory than is available (`available` bytes; default: what the system says is free)."""
    groups = parameter_groups(config)
    parameters = sum(count for _, count in groups)
    available = available_host_memory() if available is None else available
    needed = parameters * IMPORT_BYTES_PER_PARAMETER
    if available is not None and needed > available:
        largest, count = max(groups, key=lambda group: group[1])
        named = set(re.findall(r"\w+", largest))
        keys = ", ".join(f"{key}={getattr(config, key)}" for key in _SCHEMA if key in named)
        raise MtrainError(
            f"{source}: {path} describes a model of {parameters:.3g} parameters, {count / parameters:.0%} of them in "
            f"{largest}: {keys}; importing it needs at least {_bytes(needed)} of memory and {_bytes(available)} is "
            "available; check those keys, or import it on a machine with more memory"
        )
    return parameters


def _bytes(count: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if count < 1000 or unit == "PB":
            return f"{count:,.1f} {unit}" if unit != "B" else f"{int(count)} B"
        count /= 1000
    raise AssertionError("unreachable")
