"""Write a transformers model directory from a trained run (`mtrain export format=hf`).

    out/
      config.json, model.safetensors    PegasusForConditionalGeneration (hf_model.py), saved by transformers
      generation_config.json            the run's decoding settings (hf_generation.py)
      tokenizer.json, tokenizer_config.json
                                        the run's SentencePiece model for `tokenizers` (hf_tokenizer.py)
      spm.model                         that model as trained (what `init_from=` reads back)

A run started from an imported MarianMTModel (its tokenizer is Marian's) is written as a
MarianMTModel with its MarianTokenizer files instead (hf_marian.py), and one started from
M2M100 or NLLB-200 (fairseq's tokenizer) as an M2M100ForConditionalGeneration with its
tokenizer files (hf_m2m100.py).
      README.md                         the model card (model_card.py)
      mtrain_export.json                what mtrain wrote (format "hf", the files) and from which
                                        checkpoint (mtrain.export.target: what force=true may replace)

The directory loads offline, with no custom code:
`AutoModelForSeq2SeqLM.from_pretrained(out)` and `AutoTokenizer.from_pretrained(out)`.
`transformers` is an optional dependency (`pip install mtrain[hf]`), imported only here.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from mtrain import __version__
from mtrain.config import DecodeConfig, to_typed
from mtrain.data.tags import lang_tag, reserved_symbols
from mtrain.decode.engines.directions import RunLanguages
from mtrain.errors import MtrainError
from mtrain.export.hf_generation import generation_settings
from mtrain.export.hf_m2m100 import build_m2m100, m2m100_generation
from mtrain.export.hf_marian import build_marian
from mtrain.export.hf_model import build_pegasus, check_hf_exportable
from mtrain.export.hf_tokenizer import build_hf_tokenizer
from mtrain.export.model_card import model_card
from mtrain.export.portable import name_in_run
from mtrain.export.target import check_export_target, write_record
from mtrain.run_summary import load_run_summary
from mtrain.rundir import staged
from mtrain.tokenizer.trimmed_vocab import transformers_files


def import_transformers() -> Any:
    try:
        import transformers
    except ImportError as error:
        raise MtrainError(
            "format=hf: transformers is not installed; install it with pip install 'mtrain[hf]'"
        ) from error
    return transformers


def export_hf_run(
    run_dir: Path,
    out_dir: Path,
    which: str = "best",
    force: bool = False,
    weights: str = "auto",
) -> Path:
    """`mtrain export format=hf`: the run's checkpoint (`which`: best|last|a path) with its
    `weights` (auto: the weights' average when the run kept one) into `out_dir`.

    Everything is checked before anything is written; the directory is written next to
    `out_dir` and renamed into place, so a failed export leaves no half-written model.
    """
    from mtrain.checkpoint.files import load_run

    out_dir = Path(out_dir)
    check_export_target(out_dir, force, run_dir)  # before anything loads
    transformers = import_transformers()
    transformers.utils.logging.disable_progress_bar()  # the command prints one line when done
    loaded = load_run(run_dir, which=which, weights=weights)
    config, tokenizer = loaded.config, loaded.tokenizer
    if not (tokenizer.marian or tokenizer.fairseq):  # those go back as they came (hf_marian.py, hf_m2m100.py)
        check_hf_exportable(config.model, tokenizer.joint)
    languages = RunLanguages.of(config.get("data"))
    tags = reserved_symbols(languages.data)
    target_tags = {lang: lang_tag(lang) for lang in languages.target_languages()} if languages.lang_tags else {}

    special = tokenizer.special_ids
    vocab_size = tokenizer.tgt_vocab_size
    if tokenizer.marian:
        data = config.get("data") or {}
        model, hf_tokenizer = build_marian(
            loaded.model.state_dict(), config.model, tokenizer, (data.get("src"), data.get("tgt"))
        )
    elif tokenizer.fairseq:
        model = build_m2m100(loaded.model.state_dict(), config.model, tokenizer)
        hf_tokenizer = None  # its files are the run's tokenizer/, copied below
    else:
        model = build_pegasus(
            loaded.model.state_dict(), config.model, vocab_size, special.pad, special.bos, special.eos
        )
        hf_tokenizer = build_hf_tokenizer(tokenizer, tags, int(config.model.max_positions))
    # The run's decoding, as its test split was decoded; a key added since takes its default.
    decode = to_typed(OmegaConf.merge(OmegaConf.structured(DecodeConfig), config.get("decode") or {}))
    generation = generation_settings(
        decode, special, tokenizer.target_symbol_ids(tags), int(config.model.max_positions)
    )
    if tokenizer.fairseq:
        targets = languages.target_languages()
        generation = m2m100_generation(generation, tokenizer, targets[0] if len(targets) == 1 else None)
    model.generation_config = transformers.GenerationConfig(**generation)
    exported = {
        "checkpoint": name_in_run(loaded.checkpoint_path, Path(run_dir)),  # no path of this machine
        "update": loaded.update,
        "weights": loaded.weights,
        "parameters": sum(p.numel() for p in loaded.model.parameters()),
        "architecture": type(model).__name__,
    }
    card = model_card(config, load_run_summary(Path(run_dir)), exported, generation, target_tags)

    with staged(out_dir) as staging:
        model.save_pretrained(staging)
        if hf_tokenizer is not None:
            hf_tokenizer.save_pretrained(staging)
        if tokenizer.trimmed is not None:  # init_vocab=corpus: files that give the trimmed ids in transformers
            transformers_files(tokenizer.trimmed, tokenizer.files, staging)
        else:
            tokenizer.save(staging)  # the SentencePiece file(s) as trained: `init_from=` reads the directory back
        (staging / "README.md").write_text(card, encoding="utf-8")
        record = {"format": "hf", "created": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
        write_record(staging, {**record, **exported, "mtrain_version": __version__})
        _plain_modes(staging)
    return out_dir


def _plain_modes(directory: Path) -> None:
    """Give every file the mode a plain write would (0666 less the umask): transformers writes
    model.safetensors 0600, which would keep the model from anyone else who serves it."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.iterdir():
        os.chmod(path, 0o666 & ~umask)
