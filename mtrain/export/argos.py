"""Write an Argos Translate package (`FILE.argosmodel`) from a trained run.

    FILE.argosmodel                    a zip archive of one folder, translate-<src>_<tgt>/
      metadata.json                    Argos's package metadata: type, from/to codes and names,
                                       package_version, argos_version; and "mtrain": the run's name,
                                       the checkpoint in it, its update and weights, mtrain's version
                                       (no path of the exporting machine), which also marks the package
                                       as mtrain's (mtrain.export.target: what force=true may replace)
      model/                           the CTranslate2 model (mtrain.export.ctranslate2_model),
                                       its config.json with add_source_eos
      sentencepiece.model              the run's (joint) SentencePiece model
      minisbd/keep_lines_whole.onnx    the sentence splitter: each line is one sentence
      README.md

`argostranslate.package.install_from_path(FILE)` unpacks it into Argos's packages folder and
`argostranslate.translate.translate(text, src, tgt)` translates with it, offline:

- Sentences. Argos 1.11 translates a text line by line and splits each line into sentences
  with MiniSBD, which downloads a model for the language on first use unless the package
  holds one in `minisbd/`. This one holds `keep_lines_whole.onnx` (made by
  scripts/make_argos_splitter.py), which never splits: one line, one sentence, as `mtrain
  translate` and `mtrain serve` read their input. Nothing is downloaded at install or
  translate time.
- A run started from M2M100/NLLB-200: its sources start with the source language's token
  (`deu_Latn`), which the model's config asks CTranslate2 to add (`add_source_bos` with that
  token as `bos_token`), and its translations with the target language's, which Argos forces
  and strips from the text (metadata.json's `target_prefix`). Argos turns `_` into spaces
  before it strips that prefix, so the package's vocabulary names the language tokens
  `<eng-Latn>` (`<en>` for M2M100's `__en__`).
- The end of the source. mtrain's sources end with `</s>`; Argos passes SentencePiece's pieces
  alone, so the model's config asks CTranslate2 to add it (`add_source_eos`). The model in
  `model/` is therefore not an `mtrain export` directory (mtrain would add a second one) and
  has no `mtrain_export.json`: what that file says is in metadata.json.
- What Argos decodes with, and mtrain does not choose: beam 4 (ARGOS_BEAM_SIZE), length
  penalty 0.2 counted without the end token, at most 256 output tokens, `<unk>` replaced by
  the source piece it attends to most, and `_` in the output turned into a space. `mtrain
  translate engine=ctranslate2 decode.beam=4 decode.length_penalty=0.2` on the same text
  gives the same lines but where those differ (docs/EXPORT.md counts them).

Refused, each in one line: a run whose sources start with a tag (data.lang_tags, a tagged
corpus: Argos has no source prefix), and a run with separate source and target SentencePiece
models (an Argos package has one).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from mtrain.data.languages import language_name
from mtrain.data.tags import source_tags
from mtrain.decode.engines.ct2_engine import METADATA_FILE
from mtrain.decode.engines.directions import RunLanguages
from mtrain.errors import MtrainError
from mtrain.export.argos_score import package_score_line
from mtrain.export.ctranslate2_model import export_ctranslate2, run_metadata
from mtrain.export.portable import name_in_run
from mtrain.export.target import check_export_target
from mtrain.rundir import staged
from mtrain.tokenizer.fairseq_vocab import SPM_FILE

SUFFIX = ".argosmodel"
SPLITTER = Path(__file__).with_name("keep_lines_whole.onnx")
# The Argos Translate release this layout is written for: the first to read a package's minisbd/ model.
ARGOS_VERSION = "1.11"
PACKAGE_VERSION = "1.0"


def export_argos(
    run_dir: Path,
    out_file: Path,
    which: str = "best",
    quantization: str | None = None,
    force: bool = False,
    weights: str = "auto",
    score: bool = False,
) -> tuple[Path, str | None]:
    """`mtrain export format=argos`: the run's checkpoint (`which`) as the package `out_file`;
    with `score`, also the line that says what the package's decoding scores (argos_score.py)."""
    from mtrain.checkpoint.files import load_run

    out_file = Path(out_file)
    if out_file.suffix != SUFFIX:
        raise MtrainError(f"out={out_file}: an Argos package is a file named *{SUFFIX}; e.g. out=de_en{SUFFIX}")
    check_export_target(out_file, force, run_dir)  # before anything loads
    loaded = load_run(run_dir, which=which, weights=weights)
    src, tgt = package_direction(RunLanguages.of(loaded.config.data))
    if not loaded.tokenizer.joint:
        raise MtrainError(
            f"run={run_dir}: separate source and target SentencePiece models; an Argos package has one "
            "(sentencepiece.model), so format=argos needs a run trained with a joint tokenizer"
        )
    scored = None
    with (
        staged(out_file, directory=False) as partial,
        tempfile.TemporaryDirectory(prefix=f".{out_file.name}.", dir=out_file.parent) as scratch,
    ):
        folder = Path(scratch) / f"translate-{src}_{tgt}"
        model_dir = export_ctranslate2(
            loaded.model.state_dict(),
            loaded.config.model,
            loaded.tokenizer,
            folder / "model",
            quantization,
            metadata=run_metadata(loaded),
        )
        if score:
            scored = package_score_line(
                model_dir, Path(run_dir), f"{src}-{tgt}", int(loaded.config.model.max_positions)
            )
        provenance = json.loads((model_dir / METADATA_FILE).read_text(encoding="utf-8"))
        (model_dir / METADATA_FILE).unlink()
        # A run started from a MarianMTModel: its source model (transformers, too, decodes targets
        # of one vocabulary with it; CTranslate2 numbers the pieces by its own vocabulary).
        spm_name = "source.spm" if loaded.tokenizer.marian else SPM_FILE if loaded.tokenizer.fairseq else "spm.model"
        (model_dir / spm_name).rename(folder / "sentencepiece.model")
        if loaded.tokenizer.trimmed is not None:  # init_vocab=corpus: segment into the kept pieces only
            (folder / "sentencepiece.model").write_bytes(loaded.tokenizer.trimmed.restricted_model_bytes())
        add_source_eos(model_dir / "config.json")
        language_tokens = {}
        if loaded.tokenizer.fairseq:  # M2M100/NLLB: [src_lang] pieces </s>, decoded after the forced tgt_lang
            directed = loaded.tokenizer.with_languages(src, tgt)
            rename_language_tokens(model_dir / "shared_vocabulary.json", directed.src_pieces(directed.tag_ids))
            source_token, target_token = (
                argos_language_token(piece)
                for piece in directed.src_pieces(directed.source_prefix + directed.target_prefix)
            )
            add_source_language(model_dir / "config.json", source_token)
            language_tokens = {"target_prefix": target_token}
        (folder / "minisbd").mkdir()
        shutil.copyfile(SPLITTER, folder / "minisbd" / SPLITTER.name)
        origin = {"run": Path(run_dir).resolve().name, "checkpoint": name_in_run(loaded.checkpoint_path, Path(run_dir))}
        metadata = {**package_metadata(src, tgt, {**provenance, **origin}), **language_tokens}
        (folder / "metadata.json").write_text(json.dumps(metadata, indent=2) + "\n", encoding="utf-8")
        (folder / "README.md").write_text(readme(metadata), encoding="utf-8")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for path in sorted(folder.rglob("*")):
                archive.write(path, path.relative_to(scratch))
    return out_file, scored


def package_direction(languages: RunLanguages) -> tuple[str, str]:
    """The one direction a package translates, or MtrainError: Argos passes the source's pieces
    as they are, so a run that starts its sources with a tag cannot be packaged."""
    directions = languages.directions()
    if len(directions) > 1:
        names = ", ".join(f"{s}->{t}" for s, t in directions)
        raise MtrainError(
            f"format=argos: this run translates {names} (a multilingual run); an Argos package "
            "translates one direction and cannot start the source with its language tag"
        )
    src, tgt = directions[0]
    tags = source_tags(languages.data, tgt)
    if tags:
        raise MtrainError(
            f"format=argos: this run starts every source with {' '.join(tags)} (data.lang_tags); "
            "Argos passes the source without a prefix, so the package would translate without it"
        )
    return src, tgt


def add_source_eos(config_file: Path) -> None:
    """Have CTranslate2 end every source with the eos piece, as mtrain's sources end."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["add_source_eos"] = True
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def argos_language_token(piece: str) -> str:
    """An M2M100/NLLB language token as the package's vocabulary names it: Argos 1.11 turns `_`
    in a translation into a space before it strips the target prefix, which would leave
    `eng Latn` (or `  en  `) in front of every translation; `<eng-Latn>` survives that."""
    return f"<{piece.strip('_').replace('_', '-')}>"


def rename_language_tokens(vocabulary_file: Path, language_tokens: list[str]) -> None:
    """Rename `language_tokens` in CTranslate2's vocabulary (`argos_language_token`)."""
    renamed = set(language_tokens)
    pieces = json.loads(vocabulary_file.read_text(encoding="utf-8"))
    pieces = [argos_language_token(piece) if piece in renamed else piece for piece in pieces]
    vocabulary_file.write_text(json.dumps(pieces, ensure_ascii=False), encoding="utf-8")


def add_source_language(config_file: Path, language_token: str) -> None:
    """Have CTranslate2 start every source with an M2M100/NLLB model's source language token
    (its `bos_token`, which nothing else of a model whose decoder starts from `</s>` uses)."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["add_source_bos"], config["bos_token"] = True, language_token
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def package_metadata(src: str, tgt: str, provenance: dict[str, Any]) -> dict[str, Any]:
    """metadata.json: what Argos reads (its keys), and where the weights came from ("mtrain": the
    run's name and the checkpoint within it, no path of this machine)."""
    return {
        "type": "translate",
        "package_version": PACKAGE_VERSION,
        "argos_version": ARGOS_VERSION,
        "from_code": src,
        "from_name": language_name(src),
        "to_code": tgt,
        "to_name": language_name(tgt),
        "mtrain": {
            "run": provenance["run"],
            "checkpoint": provenance["checkpoint"],
            "update": provenance["update"],
            "weights": provenance["weights"],
            "quantization": provenance["quantization"],
            "max_positions": provenance["max_positions"],
            "mtrain_version": provenance["mtrain_version"],
            "created": provenance["created"],
        },
    }


def readme(metadata: dict[str, Any]) -> str:
    origin = metadata["mtrain"]
    return (
        f"# {metadata['from_name']} → {metadata['to_name']} ({metadata['from_code']} → {metadata['to_code']})\n\n"
        f"Trained with mtrain: {origin['checkpoint']} of the run {origin['run']} (update {origin['update']}, "
        f"{origin['weights']} weights, "
        f"{origin['quantization']}), exported {origin['created']} by mtrain {origin['mtrain_version']}.\n\n"
        "Each line of a text is translated as one sentence: the package's sentence splitter\n"
        "(minisbd/keep_lines_whole.onnx) keeps lines whole, as mtrain does, and needs no download.\n"
    )
