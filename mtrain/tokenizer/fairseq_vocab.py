"""M2M100's and NLLB-200's tokenizer files: one SentencePiece model numbered by fairseq.

Both families segment with `sentencepiece.bpe.model` and number the pieces as fairseq's
dictionary does (`<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, then the pieces), with one token per
language appended after them; SentencePiece's own ids are never used:

- **M2M100** (M2M100Tokenizer): the table is `vocab.json`; the language tokens `__de__` follow
  it in the order of the list `tokenizer_config.json`'s `language_codes` names (`m2m100`, 100
  codes, or `wmt21`, 8), then M2M100Tokenizer's made-up words (rows no text encodes into).
- **NLLB-200** (NllbTokenizer / NllbTokenizerFast): no table: SentencePiece's piece i is id
  i + 1 (fairseq's offset; its `<unk>` is 3); the codes (`deu_Latn`) and `<mask>` have the ids
  `tokenizer.json`'s added tokens give them (the published files: right after the pieces,
  `<mask>` last), or, without a tokenizer.json, follow the pieces in the order of
  tokenizer_config.json's `additional_special_tokens` (`extra_special_tokens`).

A source is `[lang] pieces </s>` (NLLB with `legacy_behaviour: true`: `pieces </s> [lang]`); the
decoder starts from `</s>` and its first output is the target language's token
(`forced_bos_token_id`), so `bos_id()` is the `</s>` id. Decoding maps ids to pieces and
SentencePiece joins them; the language tokens and `<s>`/`<mask>` are control pieces, never text.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm

from mtrain.errors import MtrainError
from mtrain.tokenizer.piece_table import PieceTable

SPM_FILE = "sentencepiece.bpe.model"
VOCAB = "vocab.json"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
NLLB_OFFSET = 1  # SentencePiece's piece i (i >= 3) is fairseq's id i + 1
MASK = "<mask>"
TRIMMED_VOCAB = "trimmed_vocab.json"  # init_vocab=corpus's map (mtrain.tokenizer.trimmed_vocab)

# M2M100Tokenizer's code lists, in their order (the ids follow vocab.json in this order).
# fmt: off
M2M100_LANGUAGE_CODES = {
    "m2m100": ["af", "am", "ar", "ast", "az", "ba", "be", "bg", "bn", "br", "bs", "ca", "ceb", "cs", "cy", "da", "de",
               "el", "en", "es", "et", "fa", "ff", "fi", "fr", "fy", "ga", "gd", "gl", "gu", "ha", "he", "hi", "hr",
               "ht", "hu", "hy", "id", "ig", "ilo", "is", "it", "ja", "jv", "ka", "kk", "km", "kn", "ko", "lb", "lg",
               "ln", "lo", "lt", "lv", "mg", "mk", "ml", "mn", "mr", "ms", "my", "ne", "nl", "no", "ns", "oc", "or",
               "pa", "pl", "ps", "pt", "ro", "ru", "sd", "si", "sk", "sl", "so", "sq", "sr", "ss", "su", "sv", "sw",
               "ta", "th", "tl", "tn", "tr", "uk", "ur", "uz", "vi", "wo", "xh", "yi", "yo", "zh", "zu"],
    "wmt21": ["en", "ha", "is", "ja", "cs", "ru", "zh", "de"],
}
# ISO 639-1 -> the ISO 639-3 prefix of NLLB's codes, for the languages a run names by two
# letters (`data.src=de`); a prefix with several scripts (zho_Hans, zho_Hant) is refused as ambiguous.
ISO_639_1_TO_3 = {
    "af": "afr", "am": "amh", "ar": "arb", "as": "asm", "az": "azj", "ba": "bak", "be": "bel", "bg": "bul",
    "bn": "ben", "bo": "bod", "bs": "bos", "ca": "cat", "cs": "ces", "cy": "cym", "da": "dan", "de": "deu",
    "dz": "dzo", "el": "ell", "en": "eng", "eo": "epo", "es": "spa", "et": "est", "eu": "eus", "fa": "pes",
    "fi": "fin", "fj": "fij", "fo": "fao", "fr": "fra", "ga": "gle", "gd": "gla", "gl": "glg", "gn": "grn",
    "gu": "guj", "ha": "hau", "he": "heb", "hi": "hin", "hr": "hrv", "ht": "hat", "hu": "hun", "hy": "hye",
    "id": "ind", "ig": "ibo", "is": "isl", "it": "ita", "ja": "jpn", "jv": "jav", "ka": "kat", "kk": "kaz",
    "km": "khm", "kn": "kan", "ko": "kor", "ky": "kir", "lb": "ltz", "lg": "lug", "ln": "lin", "lo": "lao",
    "lt": "lit", "lv": "lvs", "mi": "mri", "mk": "mkd", "ml": "mal", "mn": "khk", "mr": "mar", "ms": "zsm",
    "mt": "mlt", "my": "mya", "ne": "npi", "nl": "nld", "nn": "nno", "nb": "nob", "no": "nob", "oc": "oci",
    "or": "ory", "pa": "pan", "pl": "pol", "ps": "pbt", "pt": "por", "ro": "ron", "ru": "rus", "sa": "san",
    "sd": "snd", "si": "sin", "sk": "slk", "sl": "slv", "sm": "smo", "sn": "sna", "so": "som", "sq": "als",
    "sr": "srp", "st": "sot", "su": "sun", "sv": "swe", "sw": "swh", "ta": "tam", "te": "tel", "tg": "tgk",
    "th": "tha", "ti": "tir", "tk": "tuk", "tl": "tgl", "tn": "tsn", "tr": "tur", "ts": "tso", "tt": "tat",
    "ug": "uig", "uk": "ukr", "ur": "urd", "uz": "uzn", "vi": "vie", "wo": "wol", "xh": "xho", "yi": "ydd",
    "yo": "yor", "zh": "zho", "zu": "zul",
}
# fmt: on


def is_fairseq_directory(directory: Path) -> bool:
    """M2M100's or NLLB's tokenizer files: the SentencePiece model with vocab.json (M2M100)
    or tokenizer.json / tokenizer_config.json (NLLB)."""
    directory = Path(directory)
    return (directory / SPM_FILE).is_file() and any(
        (directory / name).is_file() for name in (VOCAB, TOKENIZER_JSON, TOKENIZER_CONFIG)
    )


def fairseq_files(directory: Path) -> dict[str, Path]:
    """The tokenizer files of such a directory, by name (those that are there)."""
    directory = Path(directory)
    names = (SPM_FILE, VOCAB, TOKENIZER_JSON, TOKENIZER_CONFIG, TRIMMED_VOCAB)
    return {name: directory / name for name in names if (directory / name).is_file()}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise MtrainError(f"{path}: not readable JSON ({error})") from error


class FairseqSentencePiece(PieceTable):
    """A SentencePiece model numbered by fairseq's dictionary, with language tokens (see the
    module docstring); the interface of SentencePieceProcessor that `Tokenizer` calls."""

    def __init__(self, files: dict[str, Path]) -> None:
        model_file = files[SPM_FILE]
        try:
            self.model = spm.SentencePieceProcessor(model_file=str(model_file))
        except (OSError, RuntimeError) as error:
            raise MtrainError(f"{model_file}: not a readable SentencePiece model ({error})") from error
        config = _read_json(files[TOKENIZER_CONFIG]) if TOKENIZER_CONFIG in files else {}
        if not isinstance(config, dict):
            raise MtrainError(f"{files[TOKENIZER_CONFIG]}: holds no JSON object")
        self.family = "m2m100" if VOCAB in files else "nllb"
        self.legacy = bool(config.get("legacy_behaviour", False)) and self.family == "nllb"
        if self.family == "m2m100":
            self.ids, self.language_tokens = _m2m100_table(files[VOCAB], config, files.get(TOKENIZER_CONFIG))
        else:
            self.ids, self.language_tokens = _nllb_table(self.model, files, config)
        size = max(self.ids.values()) + 1
        if self.family == "m2m100":  # M2M100Tokenizer's rows after the codes (the model has them)
            size += int(config.get("num_madeup_words", 8))
        self.pieces = [""] * size
        for piece, index in self.ids.items():
            self.pieces[index] = piece
        for index, piece in enumerate(self.pieces):  # ids no file names (M2M100's made-up words)
            if not piece:
                self.pieces[index] = f"madeupword{index:04d}"
        self._unk, self._eos, self._pad = self.ids["<unk>"], self.ids["</s>"], self.ids["<pad>"]
        non_text = {"<s>", "</s>", "<pad>", MASK, *self.language_tokens.values()}
        self._control = {
            index for index, piece in enumerate(self.pieces) if piece in non_text or piece.startswith("madeupword")
        }
        self._spm_to_id = [
            self.ids.get(self.model.id_to_piece(i), self._unk) for i in range(self.model.get_piece_size())
        ]
        self._spm_to_id[self.model.unk_id()] = self._unk

    # -- languages
    @property
    def languages(self) -> list[str]:
        """The model's language codes (`de`, `deu_Latn`), in id order."""
        return sorted(self.language_tokens, key=lambda code: self.ids[self.language_tokens[code]])

    def language_code(self, language: str, key: str = "language") -> str:
        """The model's code for `language`: the code itself, its token (`__de__`) or, for NLLB, a
        two-letter code whose language the model has in one script (`de` -> `deu_Latn`); refused in
        one line naming the nearest codes otherwise."""
        given = str(language)
        if given in self.language_tokens:
            return given
        for code, token in self.language_tokens.items():
            if given == token:
                return code
        if self.family == "nllb":
            prefix = ISO_639_1_TO_3.get(given.lower().replace("-", "_").split("_")[0], given.lower())
            matches = [code for code in self.language_tokens if code.split("_")[0] == prefix]
            if len(matches) == 1:
                return matches[0]
            if matches:
                raise MtrainError(
                    f"{key}={given}: the model writes {given} in several scripts ({', '.join(matches)}); name one of them"
                )
        nearest = difflib.get_close_matches(given, list(self.language_tokens), n=5, cutoff=0.4)
        raise MtrainError(
            f"{key}={given}: not a language of this {self.family.upper()} model (it knows {len(self.language_tokens)}); "
            f"nearest: {', '.join(nearest) or ', '.join(self.languages[:5])}"
        )

    def language_id(self, language: str, key: str = "language") -> int:
        return self.ids[self.language_tokens[self.language_code(language, key)]]

    def language_ids(self) -> list[int]:
        """The ids of every language token (never emitted but where forced)."""
        return sorted(self.ids[token] for token in self.language_tokens.values())

    # -- what SentencePieceProcessor offers and mtrain calls (the rest: PieceTable)
    def _encode_one(self, text: str) -> list[int]:
        return [self._spm_to_id[i] for i in self.model.encode(text)]

    def decode(self, ids: Sequence[int]) -> str:
        pieces = [self.pieces[int(i)] for i in ids if int(i) not in self._control]
        text: str = self.model.decode_pieces(pieces)
        return text

    def bos_id(self) -> int:
        return self._eos  # the decoder starts from </s>


def _m2m100_table(
    vocab_file: Path, config: dict[str, Any], config_file: Path | None
) -> tuple[dict[str, int], dict[str, str]]:
    table = _read_json(vocab_file)
    if not isinstance(table, dict) or not all(isinstance(i, int) and not isinstance(i, bool) for i in table.values()):
        raise MtrainError(f"{vocab_file}: a vocabulary file maps each piece to an integer id (a JSON object)")
    if sorted(table.values()) != list(range(len(table))):
        raise MtrainError(f"{vocab_file}: its {len(table)} ids are not 0 .. {len(table) - 1}, each once")
    missing = [piece for piece in FAIRSEQ_SPECIALS if piece not in table]
    if missing:
        raise MtrainError(
            f"{vocab_file}: has no {', '.join(missing)}; M2M100's dictionary holds <s>, <pad>, </s>, <unk>"
        )
    name = config.get("language_codes", "m2m100")
    if name not in M2M100_LANGUAGE_CODES:
        raise MtrainError(
            f"{config_file}: language_codes={json.dumps(name)} is not one of M2M100Tokenizer's lists "
            f"({', '.join(M2M100_LANGUAGE_CODES)})"
        )
    codes = M2M100_LANGUAGE_CODES[name]
    tokens = {code: f"__{code}__" for code in codes}
    ids = dict(table)
    for index, code in enumerate(codes):
        ids[tokens[code]] = len(table) + index
    return ids, tokens


def _nllb_table(
    model: spm.SentencePieceProcessor, files: dict[str, Path], config: dict[str, Any]
) -> tuple[dict[str, int], dict[str, str]]:
    ids = dict(FAIRSEQ_SPECIALS)
    for index in range(model.get_piece_size()):
        if not (model.is_control(index) or model.is_unknown(index)):
            ids[model.id_to_piece(index)] = index + NLLB_OFFSET
    first = max(ids.values()) + 1
    if TOKENIZER_JSON in files:
        saved = _read_json(files[TOKENIZER_JSON])
        added = saved.get("added_tokens", []) if isinstance(saved, dict) else []
        extra = {
            entry["content"]: entry["id"]
            for entry in added
            if isinstance(entry, dict)
            and entry.get("content") not in FAIRSEQ_SPECIALS
            and isinstance(entry.get("id"), int)
        }
    else:
        listed = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
        if not isinstance(listed, list) or not listed:
            raise MtrainError(
                f"{files.get(TOKENIZER_CONFIG, SPM_FILE)}: names no language codes (additional_special_tokens) and "
                f"there is no {TOKENIZER_JSON}; save the NllbTokenizer beside the model (tokenizer.save_pretrained)"
            )
        codes = [str(code) for code in listed if code != MASK]
        extra = {code: first + index for index, code in enumerate(codes)}
        extra[MASK] = first + len(codes)
    taken = set(ids.values())
    clashes = [piece for piece, index in extra.items() if index in taken and ids.get(piece) != index]
    if clashes:
        raise MtrainError(
            f"{files.get(TOKENIZER_JSON)}: the added token {clashes[0]} has the id of a SentencePiece piece; "
            "it is not the tokenizer of this sentencepiece.bpe.model"
        )
    ids.update(extra)
    tokens = {piece: piece for piece in extra if piece != MASK}
    if not tokens:
        raise MtrainError(
            f"{files.get(TOKENIZER_JSON)}: holds no language codes (deu_Latn, ...) among its added tokens"
        )
    return ids, tokens
