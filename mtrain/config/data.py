"""`data:` (configs/data/): where the corpus is, how it is read and cleaned, and the training corpora
of a mixture, with the rules between them and the tokenizer (`corpora_rules`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from mtrain.config.choice import Choice
from mtrain.config.convert import to_typed
from mtrain.config.tokenizer import TokenizerConfig
from mtrain.config_fields import check_section, ranged
from mtrain.errors import MtrainError


class DataFormat(Choice):
    text = "text"
    tsv = "tsv"
    jsonl = "jsonl"

    @property
    def one_file_per_language(self) -> bool:
        """text: a file per split and language; tsv/jsonl: one file per split holding both sides."""
        return self is DataFormat.text


class InvalidUtf8(Choice):
    skip = "skip"
    error = "error"


class Normalization(Choice):
    NFKC = "NFKC"
    NFC = "NFC"


@dataclass
class SplitsConfig:
    """Names of the splits as the local files (or the Hub dataset) call them."""

    train: str = "train"
    valid: str = "val"
    test: str | None = "test_2016_flickr"  # null: no test split (a smoke run, or no test set yet)


@dataclass
class HubConfig:
    """Where the corpus lives on the Hugging Face Hub (used when no local copy is found)."""

    id: str | None = None  # e.g. "wmt/wmt14"
    config: str | None = None  # e.g. "de-en"
    # Branch, tag or commit; null: main. "refs/convert/parquet" reads the Hub's parquet export
    # (mtrain falls back to it by itself when main holds a loading script).
    revision: str | None = None
    # Our split name (train/valid/test) -> the Hub's split name.
    splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "valid": "validation", "test": "test"})
    # Column holding a {lang: text} dict (wmt14 style); when null, one column per
    # language named by `src_field`/`tgt_field` (defaulting to the language codes).
    translation_field: str | None = "translation"
    src_field: str | None = None
    tgt_field: str | None = None


@dataclass
class CleanConfig:
    """Filters applied to training pairs (validation/test sets are never filtered)."""

    max_len: int = ranged(256, at_least=1)  # subword tokens per side
    min_len: int = ranged(1, at_least=0)
    # longer/shorter side, in subword tokens
    max_len_ratio: float = ranged(3.0, at_least=1.0, why="(the longer side over the shorter)")
    drop_identical: bool = False
    deduplicate: bool = False
    normalize: Normalization | None = None
    # Drop training pairs whose source side also occurs in the validation or test split
    # (they are counted and logged either way; metrics.json records the counts).
    drop_eval_overlap: bool = False

    def check(self, prefix: str) -> None:
        if self.min_len > self.max_len:
            raise MtrainError(f"{prefix}.min_len: {self.min_len} is above {prefix}.max_len={self.max_len}")


@dataclass
class SubwordSamplingConfig:
    """Subword regularisation (Kudo 2018; BPE-dropout, Provilkov et al. 2020): each epoch trains
    on another sampled segmentation of the training split. Validation and test stay deterministic."""

    # 0: off. Unigram: the smoothing exponent of the segmentation lattice (smaller: flatter,
    # longer sequences; 0.5 changes ~40% of Multi30k's sentences and adds 3% tokens).
    # BPE: the probability of dropping a merge (BPE-dropout, e.g. 0.1).
    alpha: float = 0.0
    nbest_size: int = -1  # unigram: sample from the n best segmentations; -1: from all of them
    copies: int = 10  # segmentations encoded (and cached); epoch e trains on copy (e - 1) % copies


@dataclass
class CorpusConfig:
    """One training corpus of `data.corpora`. Unset (null) keys take the value of `data`'s key
    of the same name; the corpus is found as `data` is (local_dir, $MTRAIN_DATA_DIR/<name>, Hub)
    and only its training split is read: validation and test sets come from `data` itself."""

    name: str | None = None  # label in logs, metrics and the cache; and where to find it (as data.name)
    src: str | None = None
    tgt: str | None = None
    local_dir: str | None = None  # e.g. a folder holding `mtrain translate` output (back-translation)
    format: DataFormat | None = None
    pattern: str | None = None  # as data.pattern, e.g. "synthetic.{lang}"
    split: str | None = None  # the split read for training; null: data.splits.train
    hub: HubConfig | None = None
    train_limit: int | None = ranged(None, at_least=1, why="(or null: data.train_limit)")
    # Share of the training draw: each epoch draws weight * size^(1/data.sampling_temperature)
    # pairs in proportion (1 everywhere and temperature 1: the corpora concatenated).
    weight: float = ranged(1.0, above=0, why="and finite (its share of the training draw)")
    # A reserved symbol <tag> starts every source sentence of this corpus, e.g. bt for
    # tagged back-translation (Caswell et al. 2019); null: no tag.
    tag: str | None = None

    def check(self, prefix: str) -> None:
        if self.tag is None:
            return
        symbol = f"<{self.tag}>"
        if not self.tag or any(character.isspace() or character in "<>" for character in self.tag):
            raise MtrainError(
                f"{prefix}.tag: {self.tag!r} must be a non-empty name without spaces or "
                "angle brackets (e.g. bt: the symbol <bt>)"
            )
        if symbol in SPECIAL_PIECES:
            raise MtrainError(
                f"{prefix}.tag: {self.tag!r} makes {symbol}, a special piece of the tokenizer; "
                "choose another name (e.g. bt)"
            )


# SentencePiece's own pieces: a tag must not be one of them.
SPECIAL_PIECES = ("<unk>", "<s>", "</s>", "<pad>")


@dataclass
class DataConfig:
    name: str = "multi30k"
    src: str = "de"
    tgt: str = "en"
    # Resolution order: local_dir, then $MTRAIN_DATA_DIR/<name>, then the Hub.
    local_dir: str | None = None
    format: DataFormat = DataFormat.text
    # File name per split and language; `.gz` is tried too. For tsv/jsonl the
    # {lang} placeholder is absent: "{split}.tsv".
    pattern: str = "{split}.{lang}"
    splits: SplitsConfig = field(default_factory=SplitsConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    subword_sampling: SubwordSamplingConfig = field(default_factory=SubwordSamplingConfig)
    # Keep only the first N training pairs (quick experiments and tests).
    train_limit: int | None = ranged(None, at_least=1)
    # What to do with a line that is not valid UTF-8: skip the pair and count it, or fail.
    invalid_utf8: InvalidUtf8 = InvalidUtf8.skip
    # Encoded corpora and tokenizers are cached here, keyed by data+settings hashes.
    cache_dir: str | None = None  # default: $MTRAIN_CACHE or ~/.cache/mtrain
    num_workers: int = ranged(1, at_least=1)  # processes for encoding during preparation
    chunk_size: int = ranged(100_000, at_least=1)  # pairs per preparation chunk
    # Several training corpora, each with its own source, direction, weight and tag (see
    # CorpusConfig); empty: the one corpus above. Validation and test sets are data's own, one
    # pair of them per direction the corpora train.
    corpora: list[CorpusConfig] = field(default_factory=list)
    # fairseq's --sampling-temperature: corpus i is drawn in proportion to
    # weight_i * size_i^(1/T); 1: by size (times weight), larger: flatter, towards uniform.
    sampling_temperature: float = ranged(
        1.0,
        above=0,
        why="and finite (1: draw in proportion to size times weight; larger: flatter, e.g. 100 for nearly uniform)",
    )
    # A target-language token <2xx> starts every source sentence (Johnson et al. 2017,
    # fairseq --encoder-langtok tgt): one model for several directions; translate tgt_lang=xx.
    lang_tags: bool = False

    def check(self, prefix: str) -> None:
        if len(self.corpora) > 1 and self.subword_sampling.alpha > 0:
            raise MtrainError(
                f"{prefix}.subword_sampling.alpha: subword sampling trains on one corpus; with several "
                f"{prefix}.corpora set it to 0"
            )


def check_corpora(data: Any, tokenizer: Any) -> None:
    """data's values, data.corpora, data.sampling_temperature, data.lang_tags and the tags against
    the tokenizer: config nodes or the dataclasses (`prepare_data` checks library callers too)."""
    data, tokenizer = to_typed(data), to_typed(tokenizer)
    check_section(data, "data")
    corpora_rules(data, tokenizer)


def corpora_rules(data: DataConfig, tokenizer: TokenizerConfig) -> None:
    """The rules between data.corpora, data and the tokenizer (their own values are checked)."""
    lang_symbols = {f"<2{corpus.tgt or data.tgt}>" for corpus in data.corpora} | {f"<2{data.tgt}>"}
    directions = []
    for index, corpus in enumerate(data.corpora):
        name = f"data.corpora[{index}]"
        src, tgt = corpus.src or data.src, corpus.tgt or data.tgt
        if src == tgt:
            raise MtrainError(
                f"{name}.tgt: '{tgt}' is also its source language ({name}.src or data.src); "
                "a corpus translates between two languages"
            )
        if (src, tgt) not in directions:
            directions.append((src, tgt))
        if data.lang_tags and corpus.tag is not None and f"<{corpus.tag}>" in lang_symbols:
            raise MtrainError(
                f"{name}.tag: <{corpus.tag}> is also a target-language tag (data.lang_tags=true); choose another name"
            )
    ambiguous = source_with_several_targets(directions)
    if ambiguous is not None and not data.lang_tags:
        src, targets = ambiguous
        raise MtrainError(
            f"data.lang_tags: false, but data.corpora translates {src} into {' and '.join(targets)}: without "
            "a target-language tag the model cannot know which to write; set data.lang_tags=true (with "
            "tokenizer.joint=true)"
        )
    if data.lang_tags and not tokenizer.joint:
        raise MtrainError(
            "data.lang_tags: the language tags need one vocabulary for all languages; set tokenizer.joint=true"
        )
    if len(directions) > 1 and not tokenizer.joint:
        names = ", ".join(f"{src}-{tgt}" for src, tgt in directions)
        raise MtrainError(
            f"tokenizer.joint: false, but data.corpora trains {len(directions)} directions ({names}); "
            "several directions need tokenizer.joint=true"
        )
    tagged = data.lang_tags or any(corpus.tag for corpus in data.corpora)
    if data.subword_sampling.alpha > 0 and (len(data.corpora) > 1 or tagged):
        raise MtrainError(
            "data.subword_sampling.alpha: subword sampling works on one untagged training corpus; "
            "set it to 0 with several data.corpora, a corpus tag or data.lang_tags"
        )


def source_with_several_targets(directions: Sequence[tuple[str, str]]) -> tuple[str, list[str]] | None:
    """The first source language that `directions` translate into more than one language, with
    those languages; None when each source has one target. Without data.lang_tags such a run
    has nothing to tell it which of them to write."""
    for src, _ in directions:
        targets = [tgt for source, tgt in directions if source == src]
        if len(targets) > 1:
            return src, targets
    return None
