"""The encoded corpus on disk: flat memory-mapped token arrays plus int64 offsets per side.

A split directory holds

    src.tokens  src.offsets  tgt.tokens  tgt.offsets  meta.json

`*.tokens` are all sentences back to back (uint16 when the vocabulary fits, else int32);
`*.offsets` has n + 1 entries, sentence i being tokens[offsets[i]:offsets[i + 1]]. Source
sentences end with eos; targets are stored bare (bos/eos are added by `collate`).

Opening a corpus maps the files without reading them: lengths come from the offsets alone
(8 bytes per sentence), and token pages are read by the OS only when a batch touches them,
so training on a 4.5M-pair corpus starts in seconds and RAM stays flat as it grows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

SIDES = ("src", "tgt")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.int32)


class CorpusWriter:
    """Appends encoded chunks to a split directory; `close()` writes meta.json."""

    def __init__(self, directory: Path, dtype: np.dtype) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.dtype = np.dtype(dtype)
        self.size = 0
        self.num_tokens = dict.fromkeys(SIDES, 0)
        self._files = {}
        for side in SIDES:
            self._files[f"{side}.tokens"] = open(directory / f"{side}.tokens", "wb")
            self._files[f"{side}.offsets"] = open(directory / f"{side}.offsets", "wb")
            self._files[f"{side}.offsets"].write(np.zeros(1, dtype=np.int64).tobytes())

    def append(
        self, src_tokens: np.ndarray, src_lengths: np.ndarray, tgt_tokens: np.ndarray, tgt_lengths: np.ndarray
    ) -> None:
        if len(src_lengths) != len(tgt_lengths):
            raise ValueError("source and target chunks differ in size")
        for side, tokens, lengths in (("src", src_tokens, src_lengths), ("tgt", tgt_tokens, tgt_lengths)):
            offsets = self.num_tokens[side] + np.cumsum(lengths, dtype=np.int64)
            self._files[f"{side}.tokens"].write(np.ascontiguousarray(tokens, dtype=self.dtype).tobytes())
            self._files[f"{side}.offsets"].write(offsets.tobytes())
            self.num_tokens[side] += int(lengths.sum())
        self.size += len(src_lengths)

    def close(self) -> None:
        for handle in self._files.values():
            handle.close()
        meta = {"size": self.size, "dtype": self.dtype.name, "num_tokens": self.num_tokens}
        (self.directory / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


class EncodedCorpus:
    """Sentence pairs as token arrays; memory-mapped from a split directory, or in memory."""

    def __init__(
        self,
        src_tokens: np.ndarray,
        src_offsets: np.ndarray,
        tgt_tokens: np.ndarray,
        tgt_offsets: np.ndarray,
        directory: Path | None = None,
    ) -> None:
        if len(src_offsets) != len(tgt_offsets):
            raise ValueError("source and target offsets differ in size")
        self.src_tokens, self.src_offsets = src_tokens, src_offsets
        self.tgt_tokens, self.tgt_offsets = tgt_tokens, tgt_offsets
        self.directory = directory
        self.src_lengths = np.diff(np.asarray(src_offsets))  # (n,) including the appended eos
        self.tgt_lengths = np.diff(np.asarray(tgt_offsets))  # (n,) y only

    @classmethod
    def open(cls, directory: Path) -> EncodedCorpus:
        directory = Path(directory)
        meta = json.loads((directory / "meta.json").read_text(encoding="utf-8"))
        arrays = {}
        for side in SIDES:
            arrays[f"{side}_tokens"] = _map(directory / f"{side}.tokens", np.dtype(meta["dtype"]))
            arrays[f"{side}_offsets"] = _map(directory / f"{side}.offsets", np.dtype(np.int64))
        return cls(directory=directory, **arrays)

    @classmethod
    def from_sequences(cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> EncodedCorpus:
        """An in-memory corpus (`src` sequences already end with eos): tests, small inputs."""

        def pack(sequences: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
            lengths = np.array([len(s) for s in sequences], dtype=np.int64)
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            tokens = np.fromiter((t for s in sequences for t in s), np.int32, int(offsets[-1]))
            return tokens, offsets

        return cls(*pack(src), *pack(tgt))

    def __len__(self) -> int:
        return len(self.src_lengths)

    def src(self, i: int) -> np.ndarray:
        return self.src_tokens[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_tokens[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    def target_pieces(self) -> np.ndarray:
        """The distinct target token ids, ascending (what `model.output_vocab=target` keeps)."""
        return np.unique(np.asarray(self.tgt_tokens))

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into DataLoader workers: send the path, not a copy of the mapped arrays.
        if self.directory is None:
            return self.__dict__
        return {"directory": self.directory}

    def __setstate__(self, state: dict[str, Any]) -> None:
        if set(state) == {"directory"}:
            state = EncodedCorpus.open(state["directory"]).__dict__
        self.__dict__.update(state)


def _map(path: Path, dtype: np.dtype) -> np.ndarray:
    if path.stat().st_size == 0:  # mmap cannot map an empty file
        return np.empty(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")
