"""Marian's tokenizer files: SentencePiece models whose pieces a vocabulary file numbers.

An OPUS-MT model (transformers' MarianTokenizer) segments with `source.spm` and `target.spm`
but numbers the pieces by `vocab.json` (one piece-to-id table for both sides), or by
`vocab.json` and `target_vocab.json` (separate vocabularies); SentencePiece's own ids are
never used. `MappedSentencePiece` is such a pair (model, table) behind the part of
SentencePieceProcessor's interface that `Tokenizer` and the corpus encoders call, so a run
that starts from an imported model keeps its vocabulary exactly, and its `tokenizer/`
directory holds the same four (or five) files.

What MarianTokenizer does, and this module with it:
- encoding: a leading language code `>>xx<<` is one piece of its own; the rest is segmented
  by the side's SentencePiece model into pieces, each looked up in the table by its text (a
  piece the table lacks is `<unk>`; text SentencePiece does not know keeps its surface, which
  the table may hold); the source gets `</s>` at the end (the encoded corpus adds it);
- the decoder starts from `<pad>` (there is no `<s>`): `bos_id()` is the pad id;
- decoding: ids to pieces by the table, then SentencePiece's `decode_pieces`, `▁` as spaces,
  stripped. With one table, transformers decodes targets with the *source* model, and so
  does this (the two differ only for pieces one model lacks). `<unk>` renders as
  SentencePiece writes it (" ⁇ "), as in mtrain's other translations (transformers skips it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from mtrain.errors import MtrainError
from mtrain.tokenizer.piece_table import PieceTable

SOURCE_SPM = "source.spm"
TARGET_SPM = "target.spm"
VOCAB = "vocab.json"
TARGET_VOCAB = "target_vocab.json"  # separate vocabularies only
UNK, EOS, PAD = "<unk>", "</s>", "<pad>"


def read_vocabulary(path: Path) -> dict[str, int]:
    """A vocab.json: piece -> id, the ids 0 .. n-1 each once, with <unk>, </s> and <pad>."""
    try:
        table = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise MtrainError(f"{path}: not a readable vocabulary file ({error})") from error
    if not isinstance(table, dict):
        raise MtrainError(f"{path}: a vocabulary file maps each piece to an integer id (a JSON object)")
    for piece, index in table.items():
        if not isinstance(index, int) or isinstance(index, bool):  # JSON's true would pass as id 1
            raise MtrainError(f"{path}: the piece {piece!r} has the id {json.dumps(index)}; ids are JSON integers")
    if sorted(table.values()) != list(range(len(table))):
        raise MtrainError(f"{path}: its {len(table)} ids are not 0 .. {len(table) - 1}, each once")
    missing = [piece for piece in (UNK, EOS, PAD) if piece not in table]
    if missing:
        raise MtrainError(f"{path}: has no {', '.join(missing)}; Marian's vocabularies hold <unk>, </s> and <pad>")
    return table


class MappedSentencePiece(PieceTable):
    """A SentencePiece model whose pieces get their ids from a vocabulary table."""

    def __init__(self, model_file: Path, vocab_file: Path, decoding_model_file: Path | None = None) -> None:
        """`decoding_model_file`: the model whose `decode_pieces` turns pieces into text
        (transformers' choice: the source model when source and target share one table)."""
        try:
            self.model = spm.SentencePieceProcessor(model_file=str(model_file))
            decoding = str(decoding_model_file or model_file)
            self.decoding_model = (
                self.model if decoding == str(model_file) else spm.SentencePieceProcessor(model_file=decoding)
            )
        except (OSError, RuntimeError) as error:
            raise MtrainError(f"{model_file}: not a readable SentencePiece model ({error})") from error
        self.ids = read_vocabulary(vocab_file)
        self.pieces = [""] * len(self.ids)
        for piece, index in self.ids.items():
            self.pieces[index] = piece
        self._unk, self._eos, self._pad = self.ids[UNK], self.ids[EOS], self.ids[PAD]
        self._control = {self._eos, self._pad}
        # A piece SentencePiece would output but the table lacks gives unk: one lookup per piece.
        self._spm_to_id = [
            self.ids.get(self.model.id_to_piece(i), self._unk) for i in range(self.model.get_piece_size())
        ]
        self._spm_unk = self.model.unk_id()

    # -- what SentencePieceProcessor offers and mtrain calls (the rest: PieceTable)
    def _encode_one(self, text: str) -> list[int]:
        code: list[int] = []
        if text.startswith(">>") and (end := text.find("<<")) != -1:  # MarianTokenizer.remove_language_code
            code = [self.ids.get(text[: end + 2], self._unk)]
            text = text[end + 2 :]
        ids: list[int] = self.model.encode(text)
        if self._spm_unk in ids:  # the table may hold the surface text SentencePiece does not know
            return code + [self.ids.get(piece, self._unk) for piece in self.model.encode(text, out_type=str)]
        return code + [self._spm_to_id[i] for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        pieces = [self.pieces[int(i)] for i in ids]
        text: str = self.decoding_model.decode_pieces(pieces)
        return text.replace("▁", " ").strip()

    def bos_id(self) -> int:
        return self._pad  # the decoder starts from <pad>


def is_marian_directory(directory: Path) -> bool:
    directory = Path(directory)
    return all((directory / name).is_file() for name in (SOURCE_SPM, TARGET_SPM, VOCAB))


def marian_files(directory: Path) -> dict[str, Path]:
    """The tokenizer files of a Marian directory, by name (target_vocab.json when there is one)."""
    directory = Path(directory)
    names = [SOURCE_SPM, TARGET_SPM, VOCAB] + ([TARGET_VOCAB] if (directory / TARGET_VOCAB).is_file() else [])
    return {name: directory / name for name in names}


def open_processor(model_file: str) -> Any:
    """What a corpus-encoding worker encodes one side with: the SentencePiece model at
    `model_file`, or, for Marian's source.spm/target.spm, that model numbered by the vocabulary
    file beside it (target_vocab.json for the target when there is one)."""
    path = Path(model_file)
    from mtrain.tokenizer.fairseq_vocab import SPM_FILE, fairseq_files, is_fairseq_directory
    from mtrain.tokenizer.trimmed_vocab import open_fairseq

    if path.name == SPM_FILE and is_fairseq_directory(path.parent):  # M2M100/NLLB: fairseq's numbering (trimmed)
        return open_fairseq(fairseq_files(path.parent))
    if path.name in (SOURCE_SPM, TARGET_SPM) and (path.parent / VOCAB).is_file():
        files = marian_files(path.parent)
        return mapped_side(files, source=path.name == SOURCE_SPM)
    return spm.SentencePieceProcessor(model_file=model_file)


def mapped_side(files: dict[str, Path], source: bool) -> MappedSentencePiece:
    """One side of a Marian tokenizer (`files`: marian_files's)."""
    separate = TARGET_VOCAB in files
    if source:
        return MappedSentencePiece(files[SOURCE_SPM], files[VOCAB])
    if separate:
        return MappedSentencePiece(files[TARGET_SPM], files[TARGET_VOCAB])
    return MappedSentencePiece(files[TARGET_SPM], files[VOCAB], decoding_model_file=files[SOURCE_SPM])
