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

- **M2M100ForConditionalGeneration** (M2M100, NLLB-200): mtrain's own pre-LN Transformer with
  a few options (mtrain.train.hf_m2m100); its tokenizer files (`sentencepiece.bpe.model` with
  vocab.json, or NLLB's tokenizer.json) are kept as they are (mtrain.tokenizer.fairseq_vocab):
  the decoder starts from `</s>` and is forced to emit the target language's token first.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from mtrain.config import (
    DataConfig,
    ModelConfig,
    Positions,
    TokenizerConfig,
    check_model_config,
    is_hub_id,
    to_plain,
)
from mtrain.errors import MtrainError
from mtrain.model.embeddings import padded_rows
from mtrain.model.positions import marian_sinusoidal_table, sinusoidal_table
from mtrain.rundir import RunDir
from mtrain.tokenizer import Tokenizer
from mtrain.tokenizer.fairseq_vocab import SPM_FILE, TOKENIZER_JSON, is_fairseq_directory
from mtrain.tokenizer.marian_vocab import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, VOCAB, is_marian_directory
from mtrain.tokenizer.tokenizer import JOINT_MODEL
from mtrain.train.hf_config import HfConfig, check_memory, read_config
from mtrain.train.hf_m2m100 import M2M100, m2m100_state
from mtrain.train.hf_weights import embedding, layer_names, layer_shape, padded, without_prefix

MARIAN, PEGASUS = "MarianMTModel", "PegasusForConditionalGeneration"
SUPPORTED = (MARIAN, M2M100, PEGASUS)
_MODEL_TYPES = {"marian": MARIAN, "m2m_100": M2M100, "pegasus": PEGASUS}
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
    """A directory transformers would load a model from: a config.json that names a model_type,
    or one that is not a JSON object at all where no run's checkpoints/ are (read_hf_model then
    names the file); a CTranslate2 export, whose config.json names none, is not one."""
    path = Path(path)
    config = path / "config.json"
    if not config.is_file():
        return False
    try:
        value = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        value = None
    if not isinstance(value, dict):
        return not RunDir(path).checkpoint_dir.is_dir()
    return "model_type" in value


def resolve_hub_id(init_from: str) -> Path | None:
    """A hub id (`Helsinki-NLP/opus-mt-de-en`) as a local snapshot: downloaded, or with
    HF_HUB_OFFLINE=1 taken from the local cache only; None when `init_from` is not a hub id."""
    text = str(init_from)
    if Path(text).expanduser().exists() or not is_hub_id(text):
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
    config = read_config(directory / "config.json", source)
    architecture = _architecture(config, source)
    check_memory(config, directory / "config.json", source)  # before a tensor of it is allocated
    _check_same_in_both_stacks(config, source)
    weight_files = _weight_files(directory, source)
    if architecture == MARIAN:
        if not is_marian_directory(directory):
            raise MtrainError(
                f"{source}: {directory} has no Marian tokenizer files ({SOURCE_SPM}, {TARGET_SPM}, {VOCAB}); "
                "save the MarianTokenizer beside the model (tokenizer.save_pretrained)"
            )
        tokenizer = Tokenizer.load(directory)
    elif architecture == M2M100:
        if not is_fairseq_directory(directory):
            raise MtrainError(
                f"{source}: {directory} has no M2M100/NLLB tokenizer files ({SPM_FILE} with vocab.json, or with "
                f"{TOKENIZER_JSON} and tokenizer_config.json); save the tokenizer beside the model (tokenizer.save_pretrained)"
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
    elif architecture == M2M100:
        model, state = _m2m100(config, weights, tokenizer, source)
    else:
        model, state = _pegasus(config, weights, tokenizer, source)
    tokenizer_config = _read_json(directory / "tokenizer_config.json", source, missing_ok=True)
    languages = (tokenizer_config.get("source_lang"), tokenizer_config.get("target_lang"))
    if architecture == M2M100:  # (src_lang/tgt_lang there are the tokenizer's defaults, not the model's pair)
        languages = (None, None)
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
    if imported.architecture == M2M100:  # one model for every pair of its languages
        for src, tgt in directions_of(data_cfg):
            imported.tokenizer.with_languages(src, tgt)
        return
    model_src, model_tgt = imported.languages
    for src, tgt in directions_of(data_cfg):
        for side, given, expected in (("source", src, model_src), ("target", tgt, model_tgt)):
            if expected and given and _language(given) != _language(expected):
                raise MtrainError(
                    f"data: {src}-{tgt}, but {source} translates {model_src}-{model_tgt} (its tokenizer_config.json): "
                    f"the {side} language differs; fine-tune it on {model_src}-{model_tgt} data or choose another model"
                )


def directions_of(data_cfg: DataConfig) -> list[tuple[str, str]]:
    """(source, target) of data and of each of its corpora."""
    directions = [(data_cfg.src, data_cfg.tgt)]
    directions += [(entry.src or data_cfg.src, entry.tgt or data_cfg.tgt) for entry in data_cfg.corpora or []]
    return directions


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


def _architecture(config: HfConfig, source: str) -> str:
    names = config.architectures or []  # what save_pretrained writes; else the model_type
    for name in names or [_MODEL_TYPES.get(str(config.model_type), "")]:
        if name in SUPPORTED:
            return name
    given = names[0] if names else (config.model_type or "none named")
    raise MtrainError(
        f"{source}: config.json's architecture {given} is not supported; init_from reads "
        f"{', '.join(SUPPORTED)} (mtrain's own export) directories"
    )


def _weight_files(directory: Path, source: str) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = [directory / name for name in _shard_names(index, source)]
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


def _shard_names(index: Path, source: str) -> list[str]:
    """The weight files an index's weight_map names: file names inside its directory."""
    weight_map = _read_json(index, source).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise MtrainError(
            f"{source}: {index}'s weight_map is {json.dumps(weight_map)[:80]}, not an object of weight name -> file name"
        )
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard:
            raise MtrainError(f"{source}: {index}'s weight_map gives {name} the file {json.dumps(shard)}, not a name")
        if Path(shard).is_absolute() or ".." in Path(shard).parts or not Path(shard).name.endswith(".safetensors"):
            raise MtrainError(
                f"{source}: {index}'s weight_map names {shard} for {name}; a shard is a .safetensors file "
                "inside the model's directory"
            )
    return sorted(set(weight_map.values()))


def _read_weights(files: list[Path], source: str) -> dict[str, Tensor]:
    """Every tensor of `files` in float32, refused unless floating point and finite (a
    final_logits_bias may hold -inf: the pieces a Pegasus export never emits)."""
    weights: dict[str, Tensor] = {}
    for path in files:
        read = _read_weights_file(path, source)
        for name, tensor in read.items():
            if not isinstance(tensor, Tensor) or not tensor.is_floating_point():
                kind = tensor.dtype if isinstance(tensor, Tensor) else type(tensor).__name__
                raise MtrainError(
                    f"{source}: {path}'s {name} is {str(kind).removeprefix('torch.')}, not floating-point weights; "
                    "the file was not written by save_pretrained"
                )
            tensor = tensor.float()
            unusable = tensor.isnan() | (tensor.isinf() if name != "final_logits_bias" else tensor.isposinf())
            if unusable.any():
                raise MtrainError(
                    f"{source}: {path}'s {name} holds {int(unusable.sum())} NaN or infinite values; "
                    "the model diverged or the file is damaged"
                )
            weights[name] = tensor
    return weights


def _read_weights_file(path: Path, source: str) -> dict[str, Any]:
    """A safetensors file, or a pytorch_model.bin read without running code (weights_only)."""
    if path.suffix == ".safetensors":
        try:
            from safetensors.torch import load_file
        except ImportError as error:
            raise MtrainError(
                f"{source}: reading {path.name} needs safetensors; install it with pip install 'mtrain[hf]'"
            ) from error
        try:
            return load_file(str(path))
        except Exception as error:  # a truncated or foreign file: safetensors' own error
            raise MtrainError(f"{source}: {path} is not readable safetensors ({_first_line(error)})") from error
    try:
        with warnings.catch_warnings():  # (torch warns of pickle protocols before it refuses the file)
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # torch's message: 7 lines suggesting weights_only=False
        found = re.search(r"Unsupported global: GLOBAL (\S+)|Unsupported operand \d+", str(error))
        what = f"calls {found.group(1)}" if found and found.group(1) else "holds more than tensors"
        raise MtrainError(
            f"{source}: {path} is a pickle that {what}; mtrain reads weights only and runs no code from "
            "a model file: save the model as model.safetensors (save_pretrained's default)"
        ) from error
    except Exception as error:
        raise MtrainError(f"{source}: {path} is not readable ({type(error).__name__}: {_first_line(error)})") from error
    if not isinstance(state, dict):
        raise MtrainError(f"{source}: {path} holds a {type(state).__name__}, not a state dict of weights")
    return state


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


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
    config: HfConfig, weights: dict[str, Tensor], tokenizer: Tokenizer, source: str
) -> tuple[ModelConfig, dict[str, Tensor]]:
    share, tie = config.share_encoder_decoder_embeddings, config.tie_word_embeddings
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
    _check_vocabulary((config.vocab_size, config.target_vocab_size), tokenizer, source)
    _check_special_ids(config, tokenizer, source, decoder_start=tokenizer.pad_id)
    model = _model_config(
        config,
        source,
        norm_position="post",
        final_norm=False,
        positions="sinusoidal_marian",
        tie_embeddings=tie,
        output_bias=True,
    )
    for stack in ("encoder", "decoder"):  # transformers does not save them; a file that does must hold Marian's
        name = f"model.{stack}.embed_positions.weight"
        table = weights.pop(name, None)
        if table is not None and not _equal_table(table, marian_sinusoidal_table(model.max_positions, model.d_model)):
            raise MtrainError(
                f"{source}: {name} is not Marian's sinusoidal table of max_position_embeddings x d_model, the "
                "only positions a MarianMTModel has; the weights file was changed"
            )
    state = _state_dict(weights, model, tokenizer, source, final_norms=False)
    bias = _final_logits_bias(weights, config.target_vocab_size, source)
    if bias.isinf().any():
        raise MtrainError(
            f"{source}: final_logits_bias holds -inf, which a MarianMTModel's has not; the file was changed"
        )
    state["output_proj.bias"] = padded(bias, padded_rows(tokenizer.tgt_vocab_size, model.vocab_multiple))
    return model, state


# ----------------------------------------------------------------------------- M2M100 / NLLB-200
def _m2m100(
    config: HfConfig, weights: dict[str, Tensor], tokenizer: Tokenizer, source: str
) -> tuple[ModelConfig, dict[str, Tensor]]:
    if not config.tie_word_embeddings or not config.share_encoder_decoder_embeddings:
        raise MtrainError(
            f"{source}: config.json unties the embeddings (tie_word_embeddings=false); an M2M100 model has one "
            "matrix for both sides and the output layer, and so does mtrain's"
        )
    if config.vocab_size < tokenizer.src_vocab_size:
        raise MtrainError(
            f"{source}: config.json's vocab_size={config.vocab_size} but its tokenizer numbers "
            f"{tokenizer.src_vocab_size} pieces and language tokens; the vocabulary must fit the embedding "
            "(is it the model's own tokenizer?)"
        )
    _check_special_ids(config, tokenizer, source, decoder_start=tokenizer.bos_id)
    pad = config.pad_token_id if config.pad_token_id is not None else tokenizer.pad_id
    model = _model_config(
        config,
        source,
        positions="sinusoidal",
        position_offset=pad + 1,  # fairseq's make_positions: the first token is at pad_id + 1
        tie_embeddings=True,
        output_bias=False,
    )
    return model, m2m100_state(weights, model, tokenizer, config.vocab_size, source)


# ----------------------------------------------------------------------------- Pegasus (mtrain's export)
def _pegasus(
    config: HfConfig, weights: dict[str, Tensor], tokenizer: Tokenizer, source: str
) -> tuple[ModelConfig, dict[str, Tensor]]:
    _check_vocabulary((config.vocab_size,) * 2, tokenizer, source)
    _check_special_ids(config, tokenizer, source, decoder_start=tokenizer.bos_id)
    d_model, max_positions = config.d_model, config.max_position_embeddings
    tables = [weights.pop(f"model.{stack}.embed_positions.weight", None) for stack in ("encoder", "decoder")]
    positions, table = Positions.learned, tables[0]
    if table is None or any(t is None or not torch.equal(t, table) for t in tables):
        raise MtrainError(f"{source}: the encoder and decoder position tables are missing or differ")
    if tuple(table.shape) != (max_positions, d_model):
        raise MtrainError(
            f"{source}: the position tables are {tuple(table.shape)}, but config.json's max_position_embeddings x "
            f"d_model is {(max_positions, d_model)}; they do not belong together"
        )
    if _equal_table(table, sinusoidal_table(max_positions, d_model)):
        positions = Positions.sinusoidal
    elif _equal_table(table, marian_sinusoidal_table(max_positions, d_model)):
        positions = Positions.sinusoidal_marian
    elif not table.any():
        positions = Positions.none
    bias = _final_logits_bias(weights, tokenizer.tgt_vocab_size, source)
    allowed = torch.isfinite(bias)  # -inf: a piece the export's output_vocab=target never emits
    bias = torch.where(allowed, bias, 0.0)
    model = _model_config(
        config,
        source,
        positions=positions,
        tie_embeddings=config.tie_word_embeddings,
        output_bias=bool(bias.any()),
        output_vocab="target" if not allowed.all() else "full",
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
def _model_config(config: HfConfig, source: str, **architecture: Any) -> ModelConfig:
    """The model section of `config` with `architecture`'s keys (what the architecture fixes),
    checked as `mtrain fit` checks its own (heads that divide d_model, ...)."""
    activation = _ACTIVATIONS.get(config.activation_function)
    if activation is None:
        raise MtrainError(
            f"{source}: config.json's activation_function={config.activation_function} is not one of "
            f"{', '.join(_ACTIVATIONS)}, mtrain's model.activation relu|gelu|silu"
        )
    model = ModelConfig(
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        d_model=config.d_model,
        heads=config.encoder_attention_heads,
        ffn_dim=config.encoder_ffn_dim,
        activation=activation,  # type: ignore[arg-type]  # (OmegaConf turns the name into the Enum)
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        max_positions=config.max_position_embeddings,
        scale_embeddings=config.scale_embedding,
        **architecture,
    )
    try:
        check_model_config(model)
    except MtrainError as error:
        raise MtrainError(f"{source}: config.json gives {error}") from error
    return model


def _check_same_in_both_stacks(config: HfConfig, source: str) -> None:
    for ours, theirs in (("heads", "attention_heads"), ("ffn_dim", "ffn_dim")):
        encoder, decoder = getattr(config, f"encoder_{theirs}"), getattr(config, f"decoder_{theirs}")
        if encoder != decoder:
            raise MtrainError(
                f"{source}: config.json's encoder_{theirs}={encoder} and decoder_{theirs}={decoder} differ; "
                f"mtrain's model.{ours} is one value for both stacks"
            )


def _equal_table(table: Tensor, expected: Tensor) -> bool:
    return table.shape == expected.shape and torch.allclose(table, expected, atol=1e-6)


def _final_logits_bias(weights: dict[str, Tensor], vocab_size: int, source: str) -> Tensor:
    """final_logits_bias, (1, vocab) as transformers saves it, as one row (zeros when not saved)."""
    bias = weights.pop("final_logits_bias", None)
    if bias is None:
        return torch.zeros(vocab_size)
    if tuple(bias.shape) not in ((1, vocab_size), (vocab_size,)):
        raise MtrainError(
            f"{source}: final_logits_bias is {tuple(bias.shape)}, but the target vocabulary has {vocab_size} "
            f"pieces: (1, {vocab_size}); the weights do not belong to this config.json"
        )
    return bias.reshape(-1)


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
    for theirs, ours in names.items():
        expected = layer_shape(ours, model.d_model, model.ffn_dim)
        if tuple(state[ours].shape) != expected:
            raise MtrainError(
                f"{source}: {theirs} is {tuple(state[ours].shape)}, but config.json's d_model={model.d_model} and "
                f"ffn_dim={model.ffn_dim} make it {expected}; the weights do not belong to this config.json"
            )
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


def _check_special_ids(config: HfConfig, tokenizer: Tokenizer, source: str, decoder_start: int) -> None:
    special = tokenizer.special_ids
    expected = {"pad_token_id": special.pad, "eos_token_id": special.eos, "decoder_start_token_id": decoder_start}
    for key, value in expected.items():
        given = getattr(config, key)
        if isinstance(given, list):  # eos_token_id may be a list of one
            given = given[0] if len(given) == 1 else given
        if given is not None and given != value:
            raise MtrainError(
                f"{source}: config.json's {key}={given} but the tokenizer's is {value}; the vocabulary "
                "does not belong to these weights"
            )
