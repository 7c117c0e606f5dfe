"""`Tokenizer`: the SentencePiece model(s) of a run, behind the contract of docs/DESIGN.md.

A joint vocabulary is one file, `spm.model`; separate vocabularies are `src.model` and
`tgt.model`. A run started from an imported Marian model (OPUS-MT) keeps that model's files:
`source.spm`, `target.spm` and `vocab.json` (+ `target_vocab.json` for separate
vocabularies), whose table numbers the pieces (mtrain.tokenizer.marian_vocab); one started from
M2M100 or NLLB-200 keeps `sentencepiece.bpe.model` with its vocab.json or tokenizer.json and
tokenizer_config.json (fairseq's numbering and language tokens: mtrain.tokenizer.fairseq_vocab). The special ids are read back from the model files, where training wrote them
(`TokenizerConfig.unk_id/pad_id/bos_id/eos_id`), so a saved tokenizer is self-contained;
`Tokenizer.special_ids` hands them on together, as one `SpecialIds` value.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import sentencepiece as spm

from mtrain.errors import MtrainError
from mtrain.tokenizer.fairseq_vocab import SPM_FILE, FairseqSentencePiece, fairseq_files, is_fairseq_directory
from mtrain.tokenizer.marian_vocab import (
    SOURCE_SPM,
    TARGET_SPM,
    TARGET_VOCAB,
    VOCAB,
    MappedSentencePiece,
    is_marian_directory,
    mapped_side,
    marian_files,
)
from mtrain.tokenizer.trimmed_vocab import TrimmedVocab, open_fairseq

JOINT_MODEL = "spm.model"
SRC_MODEL = "src.model"
TGT_MODEL = "tgt.model"


@dataclass(frozen=True)
class SpecialIds:
    """The ids of the tokens that are not text: what batching, the loss, decoding and export
    need from a tokenizer. The same for source and target (`Tokenizer` checks that)."""

    unk: int
    pad: int
    bos: int
    eos: int


class Tokenizer:
    """Source and target SentencePiece processors (the same one when the vocabulary is joint).

    A multilingual run's sources start with tag symbols (`<2fr>`: mtrain.data.tags);
    `with_tags` gives the tokenizer of one direction, whose `encode_src` puts them there, the
    one place translate, eval, serve and fit's validation encode a source."""

    # Ids that start every source `encode_src` returns, and the ids of every tag symbol of the
    # run, which decoding never emits (mtrain.decode.engines.directions); () for a plain tokenizer.
    source_prefix: tuple[int, ...] = ()
    tag_ids: tuple[int, ...] = ()
    # The target-language token an M2M100/NLLB model's decoder is forced to emit first (after
    # its `</s>` start): training targets start with it, decoding forces it; () otherwise.
    target_prefix: tuple[int, ...] = ()

    def __init__(self, files: dict[str, Path]) -> None:
        """`files`: {"spm.model": path} or {"src.model": path, "tgt.model": path}, or Marian's
        {"source.spm", "target.spm", "vocab.json"[, "target_vocab.json"]: path}."""
        self.files = dict(files)
        self._src: spm.SentencePieceProcessor | MappedSentencePiece | FairseqSentencePiece | TrimmedVocab
        self._tgt: spm.SentencePieceProcessor | MappedSentencePiece | FairseqSentencePiece | TrimmedVocab
        self.fairseq = SPM_FILE in self.files
        self.marian = VOCAB in self.files and not self.fairseq
        if self.fairseq:  # one model and one table for both sides
            self.joint = True
            src_file = tgt_file = self.files[SPM_FILE]
            self._src = self._tgt = open_fairseq(self.files)  # (trimmed: init_vocab=corpus)
        elif self.marian:
            self.joint = TARGET_VOCAB not in self.files  # one table numbers both sides
            src_file, tgt_file = self.files[SOURCE_SPM], self.files[TARGET_SPM]
            self._src, self._tgt = mapped_side(self.files, source=True), mapped_side(self.files, source=False)
        else:
            self.joint = JOINT_MODEL in self.files
            src_file = self.files[JOINT_MODEL if self.joint else SRC_MODEL]
            tgt_file = self.files[JOINT_MODEL if self.joint else TGT_MODEL]
            self._src = _load_model(src_file)
            self._tgt = self._src if self.joint else _load_model(tgt_file)
        self.model_files = (str(src_file), str(tgt_file))  # what a corpus-encoding worker opens
        self.unk_id = self._src.unk_id()
        self.pad_id = self._src.pad_id()
        self.bos_id = self._src.bos_id()
        self.eos_id = self._src.eos_id()
        target_ids = (self._tgt.unk_id(), self._tgt.pad_id(), self._tgt.bos_id(), self._tgt.eos_id())
        if target_ids != (self.unk_id, self.pad_id, self.bos_id, self.eos_id):
            raise MtrainError(f"{tgt_file}: special ids differ from those of {src_file}")
        self.special_ids = SpecialIds(unk=self.unk_id, pad=self.pad_id, bos=self.bos_id, eos=self.eos_id)
        self.src_vocab_size = self._src.get_piece_size()
        self.tgt_vocab_size = self._tgt.get_piece_size()
        self._specials = {self.pad_id, self.bos_id, self.eos_id}
        digest = hashlib.sha256()
        for name in sorted(self.files):
            digest.update(name.encode() + self.files[name].read_bytes())
        self.fingerprint = digest.hexdigest()  # identifies the vocabulary in cache keys

    def encode_src(self, text: str) -> list[int]:
        """Source ids without the eos that the encoded corpus appends (after `source_prefix`)."""
        ids = self._src.encode(text)
        return [*self.source_prefix, *ids] if self.source_prefix else ids

    def symbol_id(self, symbol: str) -> int:
        """The source id of a reserved symbol (a SentencePiece user-defined symbol such as
        `<2en>`); MtrainError when the vocabulary does not hold it as one piece."""
        piece_id = self.piece_id(symbol)
        if self._src.id_to_piece(piece_id) != symbol:  # an unknown piece maps to unk
            source_model = self.files[JOINT_MODEL if self.joint else SRC_MODEL]
            raise MtrainError(
                f"tokenizer: {symbol!r} is not a piece of {source_model}; the tokenizer was trained without that tag"
            )
        return piece_id

    def target_symbol_ids(self, symbols: Sequence[str]) -> list[int]:
        """The target ids of those `symbols` the target vocabulary holds (a separate target
        vocabulary holds no tags)."""
        ids = [self._tgt.piece_to_id(symbol) for symbol in symbols]
        return [i for i, symbol in zip(ids, symbols, strict=True) if self._tgt.id_to_piece(i) == symbol]

    def with_tags(self, source_prefix: Sequence[int], tag_ids: Sequence[int]) -> Tokenizer:
        """This tokenizer (sharing its models) with `source_prefix` at the start of every source
        and `tag_ids` never emitted; the fingerprint stays the vocabulary's."""
        tagged = copy.copy(self)
        tagged.source_prefix = tuple(int(i) for i in source_prefix)
        tagged.tag_ids = tuple(int(i) for i in tag_ids)
        return tagged

    def language_codes(self) -> list[str]:
        """The language codes of an M2M100/NLLB tokenizer (`de`, `deu_Latn`), in id order; [] otherwise."""
        return self._src.languages if isinstance(self._src, FairseqSentencePiece) else []

    def with_languages(
        self, source: str, target: str, source_key: str = "source language", target_key: str = "target language"
    ) -> Tokenizer:
        """An M2M100/NLLB tokenizer for one direction (`source`, `target`: the model's codes or
        two-letter ones, `de`): sources start with the source language's token, decoding is forced
        to start with the target's, and no language token is emitted otherwise. An unknown
        language is refused in one line naming the nearest codes and the key given."""
        vocab = self._src
        if not isinstance(vocab, (FairseqSentencePiece, TrimmedVocab)):
            raise MtrainError("tokenizer: language codes belong to M2M100/NLLB tokenizers (init_from= such a model)")
        if vocab.legacy:
            raise MtrainError(
                f"{self.files.get('tokenizer_config.json')}: legacy_behaviour: true lays sources out as "
                "`x </s> [lang]`, which mtrain's corpora (eos last) cannot hold yet; use the current layout"
            )
        tagged = self.with_tags([vocab.language_id(source, source_key)], vocab.language_ids())
        tagged.target_prefix = (vocab.language_id(target, target_key),)
        return tagged

    @property
    def trimmed(self) -> TrimmedVocab | None:
        """The trimmed M2M100/NLLB vocabulary (init_vocab=corpus: its map), or None."""
        return self._src if isinstance(self._src, TrimmedVocab) else None

    def encode_tgt(self, text: str) -> list[int]:
        """Target ids without bos/eos."""
        ids: list[int] = self._tgt.encode(text)  # (SentencePiece's stub types every encode as Any)
        return ids

    def word_continuation_ids(self) -> list[int]:
        """Target pieces that continue a word: no word-start marker `▁`, a letter or digit
        first (`s` in `▁dog s`); a constraint that ends a word is not followed by one."""
        ids = []
        for i in range(self.tgt_vocab_size):
            piece = self._tgt.id_to_piece(i)
            if not (self._tgt.is_control(i) or self._tgt.is_unknown(i)) and piece[:1].isalnum():
                ids.append(i)
        return ids

    def target_encoder_within(self, allowed_ids: Sequence[int]) -> Callable[[str], list[int]]:
        """`encode_tgt` using only the pieces `allowed_ids` (and the special ones): what a
        model whose softmax ranges over those pieces (`model.output_vocab=target`) can write.
        SentencePiece's vocabulary restriction: a copy of the target model with every other
        piece marked unused, so a text is segmented into allowed pieces (a word made only of
        source-side pieces gets smaller, allowed ones)."""
        if isinstance(self._tgt, (MappedSentencePiece, FairseqSentencePiece, TrimmedVocab)):
            encode_mapped: Callable[[str], list[int]] = self._tgt.restricted(allowed_ids)
            return encode_mapped
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(self._tgt.serialized_model_proto())
        keep = {int(i) for i in allowed_ids}
        for index, piece in enumerate(proto.pieces):
            if index not in keep and piece.type == sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL:
                piece.type = sentencepiece_model_pb2.ModelProto.SentencePiece.UNUSED
        restricted = spm.SentencePieceProcessor()
        restricted.LoadFromSerializedProto(proto.SerializeToString())

        def encode(text: str) -> list[int]:
            ids: list[int] = restricted.encode(text)
            return ids

        return encode

    def decode_tgt(self, ids: Sequence[int]) -> str:
        """Detokenized text; pad/bos/eos are dropped (unk renders as SentencePiece's ⁇)."""
        text: str = self._tgt.decode([int(i) for i in ids if int(i) not in self._specials])
        return text

    def piece_id(self, piece: str) -> int:
        """The source-side id of one piece (a tag symbol such as `<2en>`); unk_id when absent."""
        return self._src.piece_to_id(piece)

    def src_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self._src.id_to_piece(int(i)) for i in ids]

    def tgt_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self._tgt.id_to_piece(int(i)) for i in ids]

    def save(self, directory: Path) -> None:
        """Copy the model file(s) into `directory` (a run's `tokenizer/`)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for name, path in self.files.items():
            shutil.copyfile(path, directory / name)

    @classmethod
    def load(cls, directory: Path) -> Tokenizer:
        directory = Path(directory)
        if (directory / JOINT_MODEL).is_file():
            return cls({JOINT_MODEL: directory / JOINT_MODEL})
        if (directory / SRC_MODEL).is_file() and (directory / TGT_MODEL).is_file():
            return cls({SRC_MODEL: directory / SRC_MODEL, TGT_MODEL: directory / TGT_MODEL})
        if is_fairseq_directory(directory):
            return cls(fairseq_files(directory))
        if is_marian_directory(directory):
            return cls(marian_files(directory))
        raise MtrainError(
            f"{directory}: no tokenizer here (expected {JOINT_MODEL}, or {SRC_MODEL} and {TGT_MODEL}, "
            f"or Marian's {SOURCE_SPM}, {TARGET_SPM} and {VOCAB})"
        )


def _load_model(path: Path) -> spm.SentencePieceProcessor:
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as error:
        raise MtrainError(f"{path}: not a readable SentencePiece model ({error})") from error
