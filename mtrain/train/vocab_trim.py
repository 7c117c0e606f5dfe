"""`init_vocab=corpus`: an imported M2M100/NLLB model whose vocabulary keeps only the rows a
fine-tune uses (which rows: mtrain.tokenizer.trimmed_vocab).

The training corpora of every direction are read once (as `mtrain fit` reads them: the train
split, data.train_limit, data.clean.normalize) and encoded with the imported tokenizer; the
pieces they use, the specials and the run's language codes are kept. The shared embedding
(source, target and output: one matrix in M2M100) keeps those rows in their original order,
so a sentence whose pieces are all kept is encoded, scored and translated exactly as before.
The map is the tokenizer's `trimmed_vocab.json`, which the run keeps in `tokenizer/` (a resume,
translate, serve and every export read it) and `parent.yaml` counts.
"""

from __future__ import annotations

import atexit
import dataclasses
import itertools
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from mtrain.checkpoint.hf_weights import padded
from mtrain.config import DataConfig
from mtrain.data.cleaning import normalizer
from mtrain.data.corpora import training_corpora
from mtrain.data.sources import ReadStats
from mtrain.errors import MtrainError
from mtrain.model.embeddings import padded_rows
from mtrain.tokenizer import Tokenizer
from mtrain.tokenizer.fairseq_vocab import FairseqSentencePiece
from mtrain.tokenizer.trimmed_vocab import kept_ids, write_trimmed_tokenizer
from mtrain.train.hf_parent import ImportedModel, directions_of

EMBEDDINGS = ("src_embed.tokens.weight", "tgt_embed.tokens.weight", "output_proj.weight")
ENCODE_BATCH = 2000  # lines per SentencePiece call


def corpus_ids(vocab: FairseqSentencePiece, data_cfg: DataConfig) -> set[int]:
    """Every id the training corpora of `data_cfg` encode into, both sides."""
    normalize = normalizer(data_cfg.clean.normalize)
    used: set[int] = set()
    for corpus in training_corpora(data_cfg):
        pairs = itertools.islice(corpus.source.pairs("train", ReadStats()), corpus.cfg.train_limit)
        while batch := list(itertools.islice(pairs, ENCODE_BATCH)):
            for ids in vocab.encode([normalize(text) for pair in batch for text in pair]):
                used.update(ids)
    return used


def trim_imported(imported: ImportedModel, data_cfg: DataConfig, source: str) -> tuple[ImportedModel, dict[str, Any]]:
    """`imported` with its vocabulary trimmed to `data_cfg`'s corpora and languages, and what
    parent.yaml records of it (`kept` of `of` rows)."""
    tokenizer = imported.tokenizer
    if not tokenizer.fairseq or tokenizer.trimmed is not None:
        raise MtrainError(
            f"init_vocab=corpus: {source} is a {imported.architecture}; trimming keeps rows of an imported "
            "M2M100/NLLB-200 vocabulary (drop init_vocab)"
        )
    vocab = FairseqSentencePiece(tokenizer.files)
    languages = sorted({vocab.language_code(code) for pair in directions_of(data_cfg) for code in pair})
    kept = kept_ids(vocab, corpus_ids(vocab, data_cfg), languages, tokenizer.files)
    # The run copies these files into its tokenizer/; the encoding workers read them until then.
    directory = Path(tempfile.mkdtemp(prefix="mtrain-trimmed-vocab-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    trimmed = Tokenizer(write_trimmed_tokenizer(tokenizer.files, kept, directory))
    rows = padded_rows(len(kept), imported.model.vocab_multiple)
    matrix = padded(imported.state_dict[EMBEDDINGS[0]][torch.tensor(kept)], rows)  # one matrix: tied
    state = dict(imported.state_dict, **dict.fromkeys(EMBEDDINGS, matrix))
    record = {"kept": len(kept), "of": tokenizer.src_vocab_size, "languages": languages}
    return dataclasses.replace(imported, tokenizer=trimmed, state_dict=state), record
