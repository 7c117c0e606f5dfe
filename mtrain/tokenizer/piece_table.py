"""A SentencePiece model whose pieces are numbered by a table of the model's own (Marian's
vocab.json, fairseq's dictionary): what both imported tokenizer kinds share of the interface of
SentencePieceProcessor that `Tokenizer` calls. A subclass sets `model`, `pieces`, `ids`, `_unk`,
`_eos`, `_pad`, `_control` and defines `_encode_one`, `decode` and `bos_id`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, overload

import sentencepiece as spm


class PieceTable:
    model: Any  # the SentencePieceProcessor that segments
    pieces: list[str]  # id -> piece
    ids: dict[str, int]  # piece -> id
    _unk: int
    _eos: int
    _pad: int
    _control: set[int]  # ids never decoded into text

    def _encode_one(self, text: str) -> list[int]:
        raise NotImplementedError

    @overload
    def encode(self, text: str) -> list[int]: ...
    @overload
    def encode(self, text: list[str]) -> list[list[int]]: ...
    def encode(self, text: str | list[str]) -> list[int] | list[list[int]]:
        if isinstance(text, str):
            return self._encode_one(text)
        return [self._encode_one(line) for line in text]

    def unk_id(self) -> int:
        return self._unk

    def pad_id(self) -> int:
        return self._pad

    def eos_id(self) -> int:
        return self._eos

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def id_to_piece(self, index: int) -> str:
        return self.pieces[int(index)]

    def piece_to_id(self, piece: str) -> int:
        return self.ids.get(piece, self._unk)

    def is_control(self, index: int) -> bool:
        return int(index) in self._control

    def is_unknown(self, index: int) -> bool:
        return int(index) == self._unk

    def restricted(self, allowed_ids: Sequence[int]) -> Callable[[str], list[int]]:
        """An encoder (text -> ids) that uses only the pieces `allowed_ids` (see
        `Tokenizer.target_encoder_within`): the others are marked unused in the model."""
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(self.model.serialized_model_proto())
        keep = {self.pieces[int(i)] for i in allowed_ids}
        for piece in proto.pieces:
            if piece.piece not in keep and piece.type == sentencepiece_model_pb2.ModelProto.SentencePiece.NORMAL:
                piece.type = sentencepiece_model_pb2.ModelProto.SentencePiece.UNUSED
        model = spm.SentencePieceProcessor()
        model.LoadFromSerializedProto(proto.SerializeToString())

        def encode(text: str) -> list[int]:
            return [self.piece_to_id(piece) for piece in model.encode(text, out_type=str)]

        return encode
