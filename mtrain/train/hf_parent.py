"""`init_from=` a Hugging Face model directory: a published model as the parent of a run.

Two architectures are read, without transformers (the weights are read with `safetensors`,
or torch for a pytorch_model.bin):

- **MarianMTModel** (OPUS-MT): its config becomes a ModelConfig of post-LN layers
  (`norm_position=post`, no final norm), Marian's sinusoids (`positions=sinusoidal_marian`),
  `activation=silu` for its "swish", `output_bias=true` for its final_logits_bias,
  `scale_embeddings` as its `scale_embedding`; one table and one matrix for both sides
  (vocab.json, shared embeddings: a joint tokenizer, tied) or one of each (vocab.json +
  target_vocab.json: separate). Its tokenizer files are kept as they are
  (mtrain.tokenizer.marian_vocab): the decoder starts from `<pad>`.
- **PegasusForConditionalGeneration** as `mtrain export format=hf` writes it (the round trip):
  pre-LN with a final norm; the position table tells sinusoidal (mtrain's), none (zeros) or
  learned; final_logits_bias tells output_bias and output_vocab=target (-inf rows); the
  SentencePiece model is the export's spm.model.

Everything is checked before anything is built, each refusal one line naming the file and key:
an architecture not in `SUPPORTED`, a directory without weights or tokenizer files, a
vocabulary whose size is not the embedding's, special ids that disagree between config and
vocabulary, a combination of shared/tied embeddings mtrain's model cannot hold, and a corpus
whose languages differ from those the tokenizer config names. The run records where it came
from in `parent.yaml` (the directory, the architecture, the weights files and their sha256).

M2M100/NLLB are not read: docs/FINETUNE.md says why.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtrain.config import DataConfig, ModelConfig, Positions, TokenizerConfig, to_plain
from mtrain.errors import MtrainError
from mtrain.model.embeddings import padded_rows
from mtrain.model.positions import marian_sinusoidal_table, sinusoidal_table
from mtrain.tokenizer import Tokenizer
from mtrain.tokenizer.marian_vocab import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, VOCAB, is_marian_directory
from mtrain.tokenizer.tokenizer import JOINT_MODEL
from mtrain.train.hf_weights import embedding, layer_names, padded, without_prefix

MARIAN, PEGASUS = "MarianMTModel", "PegasusForConditionalGeneration"
SUPPORTED = (MARIAN, PEGASUS)
_MODEL_TYPES = {"marian": MARIAN, "pegasus": PEGASUS}
_ACTIVATIONS = {"swish": "silu", "silu": "silu", "relu": "relu", "gelu": "gelu"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


@dataclass
class ImportedModel:
    """What a run takes from a Hugging Face directory."""

    architecture: str
    model: ModelConfig
    tokenizer: Tokenizer
    state_dict: dict[str, Tensor]  # mtrain's names and shapes (vocabulary rows padded)
    weight_files: list[Path]
    sha256: str  # of the weights files, in order
    languages: tuple[str | None, str | None]  # (source, target) as its tokenizer config names them


def is_hf_directory(path: Path) -> bool:
    """A directory transformers would load a model from (a config.json that names a model_type);
    a CTranslate2 export, whose config.json names none, is not one."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        return "model_type" in json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False


def resolve_hub_id(init_from: str) -> Path | None:
    """A hub id (`Helsinki-NLP/opus-mt-de-en`) as a local snapshot: downloaded, or with
    HF_HUB_OFFLINE=1 taken from the local cache only; None when `init_from` is not a hub id."""
    text = str(init_from)
    if Path(text).expanduser().exists() or text.count("/") != 1 or text.startswith((".", "/", "~")):
        return None
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return None
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    try:
        return Path(snapshot_download(text, local_files_only=offline))
    except Exception as error:  # offline with nothing cached, unknown id, no network
        where = "in the local Hugging Face cache (HF_HUB_OFFLINE is set)" if offline else "on the Hugging Face hub"
        raise MtrainError(
            f"init_from={text}: no such run directory, checkpoint file or model directory, and not found "
            f"{where} ({type(error).__name__}); give a run or a local model directory"
        ) from error


def read_hf_model(directory: Path, source: str) -> ImportedModel:
    """The model in `directory`, checked and converted (see the module docstring)."""
    directory = Path(directory)
    config = _read_json(directory / "config.json", source)
    architecture = _architecture(config, source)
    weight_files = _weight_files(directory, source)
    if architecture == MARIAN:
        if not is_marian_directory(directory):
            raise MtrainError(
                f"{source}: {directory} has no Marian tokenizer files ({SOURCE_SPM}, {TARGET_SPM}, {VOCAB}); "
                "save the MarianTokenizer beside the model (tokenizer.save_pretrained)"
            )
        tokenizer = Tokenizer.load(directory)
    else:
        if not (directory / JOINT_MODEL).is_file():
            raise MtrainError(
                f"{source}: {directory} has no {JOINT_MODEL}; only Pegasus directories written by "
                "`mtrain export format=hf` are read (their SentencePiece model is kept there)"
            )
        tokenizer = Tokenizer.load(directory)
    weights = without_prefix(_read_weights(weight_files, source))
    if architecture == MARIAN:
        model, state = _marian(config, weights, tokenizer, source)
    else:
        model, state = _pegasus(config, weights, tokenizer, source)
    tokenizer_config = _read_json(directory / "tokenizer_config.json", source, missing_ok=True)
    languages = (tokenizer_config.get("source_lang"), tokenizer_config.get("target_lang"))
    return ImportedModel(architecture, model, tokenizer, state, weight_files, _sha256(weight_files), languages)


def parent_record(imported: ImportedModel, directory: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the parent's config as a fit config's model and tokenizer sections, the lineage a run records)."""
    tokenizer = imported.tokenizer
    special = tokenizer.special_ids
    tokenizer_cfg = TokenizerConfig(
        vocab_size=tokenizer.src_vocab_size,
        joint=tokenizer.joint,
        unk_id=special.unk,
        pad_id=special.pad,
        bos_id=special.bos,
        eos_id=special.eos,
    )
    config = {"model": to_plain(imported.model), "tokenizer": to_plain(tokenizer_cfg)}
    lineage = {
        "from": str(Path(directory).resolve()),
        "architecture": imported.architecture,
        "checkpoint": str(imported.weight_files[0].resolve()),
        "weight_files": [str(path.resolve()) for path in imported.weight_files],
        "sha256": imported.sha256,
        "update": 0,
        "weights": "imported",
        "keep_optimizer": False,
        "tokenizer": tokenizer.fingerprint,
        "config": config,
    }
    return config, lineage


def check_languages(imported: ImportedModel, data_cfg: DataConfig, source: str) -> None:
    """Refuse a corpus whose direction is not the model's, when its tokenizer config names one."""
    model_src, model_tgt = imported.languages
    directions = [(data_cfg.src, data_cfg.tgt)]
    directions += [(entry.src or data_cfg.src, entry.tgt or data_cfg.tgt) for entry in data_cfg.corpora or []]
    for src, tgt in directions:
        for side, given, expected in (("source", src, model_src), ("target", tgt, model_tgt)):
            if expected and given and _language(given) != _language(expected):
                raise MtrainError(
                    f"data: {src}-{tgt}, but {source} translates {model_src}-{model_tgt} (its tokenizer_config.json): "
                    f"the {side} language differs; fine-tune it on {model_src}-{model_tgt} data or choose another model"
                )


# ----------------------------------------------------------------------------- reading
def _read_json(path: Path, source: str, missing_ok: bool = False) -> dict[str, Any]:
    if missing_ok and not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise MtrainError(f"{source}: {path} is not readable JSON ({error})") from error
    if not isinstance(value, dict):
        raise MtrainError(f"{source}: {path} holds no JSON object")
    return value


def _architecture(config: dict[str, Any], source: str) -> str:
    names = list(config.get("architectures") or [])  # what save_pretrained writes; else the model_type
    for name in names or [_MODEL_TYPES.get(str(config.get("model_type")))]:
        if name in SUPPORTED:
            return str(name)
    given = names[0] if names else config.get("model_type", "none named")
    raise MtrainError(
        f"{source}: config.json's architecture {given} is not supported; init_from reads "
        f"{', '.join(SUPPORTED)} (mtrain's own export) directories"
    )


def _weight_files(directory: Path, source: str) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_read_json(index, source).get("weight_map", {}).values()))
        files = [directory / name for name in shards]
        missing = [path.name for path in files if not path.is_file()]
        if missing:
            raise MtrainError(f"{source}: {index} names {', '.join(missing)}, which are not there")
        return files
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (directory / name).is_file():
            return [directory / name]
    raise MtrainError(
        f"{source}: {directory} has a config.json but no weights ({', '.join(WEIGHT_FILES)}); "
        "save the model with save_pretrained"
    )


def _read_weights(files: list[Path], source: str) -> dict[str, Tensor]:
    weights: dict[str, Tensor] = {}
    for path in files:
        try:
            if path.suffix == ".safetensors":
                try:
                    from safetensors.torch import load_file
                except ImportError as error:
                    raise MtrainError(
                        f"{source}: reading {path.name} needs safetensors; install it with pip install 'mtrain[hf]'"
                    ) from error
                weights.update(load_file(str(path)))
            else:
                weights.update(torch.load(path, map_location="cpu", weights_only=True))
        except MtrainError:
            raise
        except Exception as error:
            raise MtrainError(f"{source}: {path} is not readable ({type(error).__name__}: {error})") from error
    return {name: tensor.float() for name, tensor in weights.items()}


def _sha256(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def _language(code: str) -> str:
    return str(code).lower().replace("_", "-").split("-")[0]


# ----------------------------------------------------------------------------- MarianMTModel
def _marian(
    config: dict[str, Any], weights: dict[str, Tensor], tokenizer: Tokenizer, source: str
) -> tuple[ModelConfig, dict[str, Tensor]]:
    def get(key: str, default: Any = None) -> Any:
        return config.get(key, default)

    share = bool(get("share_encoder_decoder_embeddings", True))
    tie = bool(get("tie_word_embeddings", True))
    if share != tokenizer.joint or (share and not tie):
        refused = (
            "shared embeddings but an output layer of its own (tie_word_embeddings=false)"
            if share and tokenizer.joint
            else f"share_encoder_decoder_embeddings={str(share).lower()} with "
            + ("one vocabulary (vocab.json)" if tokenizer.joint else f"separate vocabularies ({TARGET_VOCAB})")
        )
        raise MtrainError(
            f"{source}: config.json has {refused}; mtrain's model ties a shared embedding to the output "
            "layer and shares one only between sides of one vocabulary"
        )
    for ours, theirs in (("heads", "attention_heads"), ("ffn_dim", "ffn_dim")):
        if get(f"encoder_{theirs}") != get(f"decoder_{theirs}"):
            raise MtrainError(
                f"{source}: config.json's encoder_{theirs}={get(f'encoder_{theirs}')} and decoder_{theirs}="
                f"{get(f'decoder_{theirs}')} differ; mtrain's model.{ours} is one value for both stacks"
            )
    activation = _ACTIVATIONS.get(str(get("activation_function")))
    if activation is None:
        raise MtrainError(
            f"{source}: config.json's activation_function={get('activation_function')} is not one of "
            f"{', '.join(_ACTIVATIONS)}, mtrain's model.activation relu|gelu|silu"
        )
    vocab_sizes = (int(get("vocab_size")), int(get("decoder_vocab_size") or get("vocab_size")))
    _check_vocabulary(vocab_sizes, tokenizer, source)
    _check_special_ids(config, tokenizer, source, decoder_start=tokenizer.pad_id)
    model = ModelConfig(
        encoder_layers=int(get("encoder_layers")),
        decoder_layers=int(get("decoder_layers")),
        d_model=int(get("d_model")),
        heads=int(get("encoder_attention_heads")),
        ffn_dim=int(get("encoder_ffn_dim")),
        activation=activation,  # type: ignore[arg-type]  # (OmegaConf turns the name into the Enum)
        dropout=float(get("dropout", 0.1)),
        attention_dropout=float(get("attention_dropout", 0.0)),
        activation_dropout=float(get("activation_dropout", 0.0)),
        norm_position="post",  # type: ignore[arg-type]
        final_norm=False,
        positions="sinusoidal_marian",  # type: ignore[arg-type]
        max_positions=int(get("max_position_embeddings")),
        scale_embeddings=bool(get("scale_embedding", False)),
        tie_embeddings=tie,
        output_bias=True,
    )
    for stack in ("encoder", "decoder"):  # transformers does not save them; a file that does must hold Marian's
        table = weights.pop(f"model.{stack}.embed_positions.weight", None)
        if table is not None and not torch.allclose(
            table, marian_sinusoidal_table(model.max_positions, model.d_model), atol=1e-6
        ):
            raise MtrainError(
                f"{source}: model.{stack}.embed_positions.weight is not Marian's sinusoidal table, the only "
                "positions a MarianMTModel has; the weights file was changed"
            )
    state = _state_dict(weights, model, tokenizer, source, final_norms=False)
    bias = weights.pop("final_logits_bias", torch.zeros(1, vocab_sizes[1]))
    state["output_proj.bias"] = padded(bias.reshape(-1), padded_rows(tokenizer.tgt_vocab_size, model.vocab_multiple))
    return model, state


# ----------------------------------------------------------------------------- Pegasus (mtrain's export)
def _pegasus(
    config: dict[str, Any], weights: dict[str, Tensor], tokenizer: Tokenizer, source: str
) -> tuple[ModelConfig, dict[str, Tensor]]:
    def get(key: str, default: Any = None) -> Any:
        return config.get(key, default)

    _check_vocabulary((int(get("vocab_size")),) * 2, tokenizer, source)
    _check_special_ids(config, tokenizer, source, decoder_start=tokenizer.bos_id)
    activation = _ACTIVATIONS.get(str(get("activation_function")))
    if activation is None:
        raise MtrainError(f"{source}: config.json's activation_function={get('activation_function')} is not supported")
    d_model, max_positions = int(get("d_model")), int(get("max_position_embeddings"))
    tables = [weights.pop(f"model.{stack}.embed_positions.weight", None) for stack in ("encoder", "decoder")]
    positions, table = Positions.learned, tables[0]
    if table is None or any(t is None or not torch.equal(t, table) for t in tables):
        raise MtrainError(f"{source}: the encoder and decoder position tables are missing or differ")
    if torch.allclose(table, sinusoidal_table(max_positions, d_model), atol=1e-6):
        positions = Positions.sinusoidal
    elif torch.allclose(table, marian_sinusoidal_table(max_positions, d_model), atol=1e-6):
        positions = Positions.sinusoidal_marian
    elif not table.any():
        positions = Positions.none
    bias = weights.pop("final_logits_bias", torch.zeros(1, tokenizer.tgt_vocab_size)).reshape(-1)
    allowed = torch.isfinite(bias)
    bias = torch.where(allowed, bias, 0.0)
    model = ModelConfig(
        encoder_layers=int(get("encoder_layers")),
        decoder_layers=int(get("decoder_layers")),
        d_model=d_model,
        heads=int(get("encoder_attention_heads")),
        ffn_dim=int(get("encoder_ffn_dim")),
        activation=activation,  # type: ignore[arg-type]
        dropout=float(get("dropout", 0.1)),
        attention_dropout=float(get("attention_dropout", 0.0)),
        activation_dropout=float(get("activation_dropout", 0.0)),
        positions=positions,
        max_positions=max_positions,
        scale_embeddings=bool(get("scale_embedding", False)),
        tie_embeddings=bool(get("tie_word_embeddings", True)),
        output_bias=bool(bias.any()),
        output_vocab="target" if not allowed.all() else "full",  # type: ignore[arg-type]
    )
    state = _state_dict(weights, model, tokenizer, source, final_norms=True)
    rows = padded_rows(tokenizer.tgt_vocab_size, model.vocab_multiple)
    if model.output_bias:
        state["output_proj.bias"] = padded(bias, rows)
    if not allowed.all():
        state["output_allowed"] = allowed.to(torch.uint8)
    if positions == Positions.learned:
        for embed in ("src_embed", "tgt_embed"):
            state[f"{embed}.positions.weight"] = table.clone()
    return model, state


# ----------------------------------------------------------------------------- shared checks
def _state_dict(
    weights: dict[str, Tensor], model: ModelConfig, tokenizer: Tokenizer, source: str, final_norms: bool
) -> dict[str, Tensor]:
    names = layer_names(model.encoder_layers, model.decoder_layers, final_norms)
    missing = [name for name in names if name not in weights]
    matrices = {which: embedding(weights, which) for which in ("source", "target", "output")}
    missing += [f"{which} embedding" for which, matrix in matrices.items() if matrix is None]
    if missing:
        raise MtrainError(
            f"{source}: the weights lack {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}; "
            "they do not fit config.json"
        )
    state = {ours: weights[theirs] for theirs, ours in names.items()}
    rows = (
        padded_rows(tokenizer.src_vocab_size, model.vocab_multiple),
        padded_rows(tokenizer.tgt_vocab_size, model.vocab_multiple),
    )
    sizes = (tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.tgt_vocab_size)
    padded_once: dict[int, Tensor] = {}  # a tied matrix (saved once) is padded once
    for (which, ours), size, row_count in zip(
        (
            ("source", "src_embed.tokens.weight"),
            ("target", "tgt_embed.tokens.weight"),
            ("output", "output_proj.weight"),
        ),
        sizes,
        (rows[0], rows[1], rows[1]),
        strict=True,
    ):
        matrix = matrices[which]
        assert matrix is not None  # checked above
        if tuple(matrix.shape) != (size, model.d_model):
            raise MtrainError(
                f"{source}: the {which} embedding is {tuple(matrix.shape)} but the vocabulary has {size} "
                f"pieces of d_model {model.d_model}; the vocabulary files do not belong to these weights"
            )
        if id(matrix) not in padded_once:
            padded_once[id(matrix)] = padded(matrix, row_count)
        state[ours] = padded_once[id(matrix)]
    return state


def _check_vocabulary(sizes: tuple[int, int], tokenizer: Tokenizer, source: str) -> None:
    for side, size, pieces in (
        ("vocab_size", sizes[0], tokenizer.src_vocab_size),
        ("decoder_vocab_size", sizes[1], tokenizer.tgt_vocab_size),
    ):
        if size != pieces:
            raise MtrainError(
                f"{source}: config.json's {side}={size} but its tokenizer has {pieces} pieces; the "
                "vocabulary must match the embedding (is it the model's own tokenizer?)"
            )


def _check_special_ids(config: dict[str, Any], tokenizer: Tokenizer, source: str, decoder_start: int) -> None:
    special = tokenizer.special_ids
    expected = {"pad_token_id": special.pad, "eos_token_id": special.eos, "decoder_start_token_id": decoder_start}
    for key, value in expected.items():
        given = config.get(key)
        if isinstance(given, list):  # eos_token_id may be a list of one
            given = given[0] if len(given) == 1 else given
        if given is not None and given != value:
            raise MtrainError(
                f"{source}: config.json's {key}={given} but the tokenizer's is {value}; the vocabulary "
                "does not belong to these weights"
            )
