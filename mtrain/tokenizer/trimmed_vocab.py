"""An M2M100/NLLB vocabulary trimmed to the pieces a fine-tune uses (`init_vocab=corpus`).

NLLB-200's 256,206 rows are 262M of its 615M parameters, and on a CPU most of an update's time
goes to the output layer; a fine-tune on one language pair uses a few percent of them. Trimming
keeps (`kept_ids`), in their original order:

- the four specials (`<s> <pad> </s> <unk>`) and every piece the training corpora encode into;
- NLLB: the codes of the run's languages and `<mask>`, plus every piece that tokenizer.json's
  BPE merges pass through on the way to a kept piece (so that transformers' fast tokenizer,
  restricted to the kept merges, segments a text as before: see `transformers_files`);
- M2M100: every language token and made-up word (M2M100Tokenizer numbers them after
  vocab.json, all of them; 108 rows).

The run's `tokenizer/` holds the imported files unchanged plus `trimmed_vocab.json`, the map
(`kept`: the original id of each new id). `TrimmedVocab` numbers by it: a text is segmented by
the SentencePiece model with every dropped piece marked unused (SentencePiece then spells a
dropped piece with kept ones: the vocabulary restriction of subword-nmt and SentencePiece),
and the ids are renumbered; a text whose pieces are all kept gets the same pieces as before.
`transformers_files` writes the tokenizer files an export carries, which give the trimmed ids
in transformers (M2M100Tokenizer: a renumbered vocab.json with that SentencePiece model; NLLB's
fast tokenizer: tokenizer.json with the kept pieces, merges and language codes renumbered).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from mtrain.errors import MtrainError
from mtrain.tokenizer.fairseq_vocab import (
    FAIRSEQ_SPECIALS,
    MASK,
    SPM_FILE,
    TOKENIZER_CONFIG,
    TOKENIZER_JSON,
    TRIMMED_VOCAB,
    VOCAB,
    FairseqSentencePiece,
)

NORMAL = sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL
UNUSED = sentencepiece_model_pb2.ModelProto.SentencePiece.UNUSED


def open_fairseq(files: dict[str, Path]) -> FairseqSentencePiece | TrimmedVocab:
    """The vocabulary of an M2M100/NLLB tokenizer directory's `files`, trimmed when they hold the map."""
    full = FairseqSentencePiece(files)
    if TRIMMED_VOCAB not in files:
        return full
    try:
        record = json.loads(Path(files[TRIMMED_VOCAB]).read_text(encoding="utf-8"))
        kept = [int(index) for index in record["kept"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise MtrainError(f"{files[TRIMMED_VOCAB]}: not a vocabulary map of mtrain's ({error})") from error
    if sorted(set(kept)) != kept or (kept and not 0 <= kept[-1] < full.get_piece_size()):
        raise MtrainError(
            f"{files[TRIMMED_VOCAB]}: its kept ids are not increasing ids of the {full.get_piece_size()}-piece "
            "vocabulary beside it; the file belongs to another tokenizer"
        )
    return TrimmedVocab(full, kept)


def restricted_model(model: spm.SentencePieceProcessor, keep_piece: Any) -> bytes:
    """`model` serialised with every normal piece for which `keep_piece(piece)` is false marked unused."""
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.serialized_model_proto())
    for piece in proto.pieces:
        if piece.type == NORMAL and not keep_piece(piece.piece):
            piece.type = UNUSED
    serialized: bytes = proto.SerializeToString()
    return serialized


class TrimmedVocab:
    """A FairseqSentencePiece renumbered to the ids `kept` (see the module docstring): what
    `Tokenizer` calls of a vocabulary, and the language codes of FairseqSentencePiece."""

    def __init__(self, full: FairseqSentencePiece, kept: Sequence[int]) -> None:
        self.full = full
        self.kept = [int(index) for index in kept]
        self.family, self.legacy = full.family, full.legacy
        self.new_id = {old: new for new, old in enumerate(self.kept)}
        self._unk = self.new_id[full.unk_id()]
        kept_pieces = {full.id_to_piece(old) for old in self.kept}
        self.model = spm.SentencePieceProcessor()
        self.model.LoadFromSerializedProto(restricted_model(full.model, kept_pieces.__contains__))
        # SentencePiece's id -> the new id (dropped pieces are unused: never produced; unk otherwise)
        self._spm_to_id = [
            self.new_id.get(full.ids.get(self.model.id_to_piece(i), -1), self._unk)
            for i in range(self.model.get_piece_size())
        ]
        self.language_tokens = {
            code: token for code, token in full.language_tokens.items() if full.ids[token] in self.new_id
        }

    def restricted_model_bytes(self) -> bytes:
        """The SentencePiece model with the dropped pieces unused: what segments a text into kept pieces."""
        serialized: bytes = self.model.serialized_model_proto()
        return serialized

    # -- languages
    @property
    def languages(self) -> list[str]:
        return [code for code in self.full.languages if code in self.language_tokens]

    def language_code(self, language: str, key: str = "language") -> str:
        code = self.full.language_code(language, key)
        if code not in self.language_tokens:
            raise MtrainError(
                f"{key}={language}: the vocabulary was trimmed at import (init_vocab=corpus) to the languages "
                f"{', '.join(self.languages)}; {code} was dropped: fine-tune from the full model to add it"
            )
        return code

    def language_id(self, language: str, key: str = "language") -> int:
        return self.new_id[self.full.language_id(self.language_code(language, key), key)]

    def language_ids(self) -> list[int]:
        return sorted(self.new_id[self.full.ids[token]] for token in self.language_tokens.values())

    # -- what Tokenizer calls
    def encode(self, text: str | list[str]) -> Any:
        if isinstance(text, str):
            return [self._spm_to_id[i] for i in self.model.encode(text)]
        return [[self._spm_to_id[i] for i in ids] for ids in self.model.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        return self.full.decode([self.kept[int(i)] for i in ids])

    def unk_id(self) -> int:
        return self._unk

    def pad_id(self) -> int:
        return self.new_id[self.full.pad_id()]

    def bos_id(self) -> int:
        return self.new_id[self.full.bos_id()]

    def eos_id(self) -> int:
        return self.new_id[self.full.eos_id()]

    def get_piece_size(self) -> int:
        return len(self.kept)

    def id_to_piece(self, index: int) -> str:
        return self.full.id_to_piece(self.kept[int(index)])

    def piece_to_id(self, piece: str) -> int:
        return self.new_id.get(self.full.piece_to_id(piece), self._unk)

    def is_control(self, index: int) -> bool:
        return self.full.is_control(self.kept[int(index)])

    def is_unknown(self, index: int) -> bool:
        return int(index) == self._unk

    def restricted(self, allowed_ids: Sequence[int]) -> Any:
        """An encoder (text -> ids) that uses only the pieces `allowed_ids`."""
        encode_full = self.full.restricted([self.kept[int(i)] for i in allowed_ids])
        return lambda text: [self.new_id.get(old, self._unk) for old in encode_full(text)]


# ----------------------------------------------------------------------------- choosing the rows
def kept_ids(
    vocab: FairseqSentencePiece, used_ids: Iterable[int], languages: Sequence[str], files: dict[str, Path]
) -> list[int]:
    """The original ids a trimmed vocabulary keeps (see the module docstring): the specials,
    `used_ids` (the corpora's pieces), the codes of `languages` (M2M100: all), and NLLB's merge
    ancestors of every kept piece."""
    kept = {vocab.ids[piece] for piece in FAIRSEQ_SPECIALS} | {int(i) for i in used_ids}
    if vocab.family == "m2m100":  # M2M100Tokenizer appends every code and made-up word after vocab.json
        first = min(vocab.ids[token] for token in vocab.language_tokens.values())
        kept |= set(range(first, vocab.get_piece_size()))
        return sorted(kept)
    kept |= {vocab.language_id(language) for language in languages} | {vocab.ids[MASK]}
    if TOKENIZER_JSON in files:
        pieces = {vocab.id_to_piece(i) for i in kept}
        for piece in merge_ancestors(_read_json(files[TOKENIZER_JSON]), pieces):
            if piece in vocab.ids:
                kept.add(vocab.ids[piece])
    return sorted(kept)


def merge_ancestors(tokenizer_json: dict[str, Any], pieces: set[str]) -> set[str]:
    """Every piece a BPE merge of tokenizer.json's model turns into one of `pieces` (transitively)."""
    merges = tokenizer_json.get("model", {}).get("merges") or []
    makers: dict[str, list[tuple[str, str]]] = {}
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        makers.setdefault(left + right, []).append((left, right))
    found, todo = set(pieces), list(pieces)
    while todo:
        for pair in makers.get(todo.pop(), []):
            for part in pair:
                if part not in found:
                    found.add(part)
                    todo.append(part)
    return found - pieces


def write_trimmed_tokenizer(files: dict[str, Path], kept: Sequence[int], directory: Path) -> dict[str, Path]:
    """The imported tokenizer `files` and the map `kept`, written into `directory` (made here):
    the files of a trimmed tokenizer (`Tokenizer.load(directory)` reads them)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, path in files.items():
        if name != TRIMMED_VOCAB:
            shutil.copyfile(path, directory / name)
            out[name] = directory / name
    record = {"kept": [int(i) for i in kept], "of": FairseqSentencePiece(files).get_piece_size()}
    (directory / TRIMMED_VOCAB).write_text(json.dumps(record) + "\n", encoding="utf-8")
    out[TRIMMED_VOCAB] = directory / TRIMMED_VOCAB
    return out


# ----------------------------------------------------------------------------- the export's files
def transformers_files(vocab: TrimmedVocab, files: dict[str, Path], out_dir: Path) -> list[str]:
    """Write the tokenizer files that give the trimmed ids in transformers into `out_dir`;
    returns their names. M2M100: vocab.json renumbered and the SentencePiece model with the
    dropped pieces unused (M2M100Tokenizer segments with it, then looks the pieces up);
    NLLB: tokenizer.json with the kept pieces, the merges among them and the kept codes, renumbered."""
    out_dir = Path(out_dir)
    full = vocab.full
    kept_pieces = {full.id_to_piece(old) for old in vocab.kept}
    (out_dir / SPM_FILE).write_bytes(restricted_model(full.model, kept_pieces.__contains__))
    written = [SPM_FILE]
    config = _read_json(files[TOKENIZER_CONFIG]) if TOKENIZER_CONFIG in files else {}
    if full.family == "m2m100":
        table = _read_json(files[VOCAB])
        renumbered = {piece: vocab.new_id[old] for piece, old in table.items() if old in vocab.new_id}
        (out_dir / VOCAB).write_text(json.dumps(renumbered, ensure_ascii=False), encoding="utf-8")
        written.append(VOCAB)
    else:
        if TOKENIZER_JSON not in files:
            raise MtrainError(
                f"{files[SPM_FILE].parent}: a trimmed NLLB vocabulary is written for transformers as a renumbered "
                f"{TOKENIZER_JSON}, and the imported model had none; import a directory with NllbTokenizerFast's files"
            )
        saved = _read_json(files[TOKENIZER_JSON])
        model = saved["model"]
        model["vocab"] = {piece: vocab.new_id[full.ids[piece]] for piece in model["vocab"] if piece in kept_pieces}
        model["merges"] = [
            merge
            for merge in model.get("merges") or []
            if all(part in kept_pieces for part in (*_parts(merge), "".join(_parts(merge))))
        ]
        saved["added_tokens"] = [
            dict(entry, id=vocab.new_id[entry["id"]]) for entry in saved["added_tokens"] if entry["id"] in vocab.new_id
        ]
        _renumber_special_tokens(saved.get("post_processor"), vocab)
        (out_dir / TOKENIZER_JSON).write_text(json.dumps(saved, ensure_ascii=False), encoding="utf-8")
        written.append(TOKENIZER_JSON)
        for key in ("additional_special_tokens", "extra_special_tokens"):
            if isinstance(config.get(key), list):
                config[key] = [code for code in config[key] if code in kept_pieces]
        codes = vocab.languages
        for key in ("src_lang", "tgt_lang"):  # defaults the trimmed model may have dropped
            if config.get(key) not in codes and codes:
                config[key] = codes[0]
    (out_dir / TOKENIZER_CONFIG).write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    written.append(TOKENIZER_CONFIG)
    return written


def _parts(merge: Any) -> tuple[str, str]:
    left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
    return str(left), str(right)


def _renumber_special_tokens(node: Any, vocab: TrimmedVocab) -> None:
    """The ids a post-processor template names (`special_tokens`: {"ids": [...], "tokens": [...]})."""
    if isinstance(node, dict):
        for name, value in list(node.items()):
            if name == "special_tokens" and isinstance(value, dict):
                for entry in value.values():
                    entry["ids"] = [vocab.piece_to_id(token) for token in entry.get("tokens", [])]
            else:
                _renumber_special_tokens(value, vocab)
    elif isinstance(node, list):
        for value in node:
            _renumber_special_tokens(value, vocab)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise MtrainError(f"{path}: not readable JSON ({error})") from error
