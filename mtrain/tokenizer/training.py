"""Train the SentencePiece model(s) for a corpus, or reuse the ones trained before.

The cache entry is keyed by the training data (the source's fingerprint of the train split,
the languages, `data.train_limit`, normalisation) and every `TokenizerConfig` setting, so a
second run with the same inputs loads the model instead of retraining, and any change trains
a new one. A joint vocabulary does not depend on the direction: de->en and en->de share it.

The training text is streamed to a file in the cache's staging directory; SentencePiece
samples at most `tokenizer.max_sentences` lines of it (reservoir sampling, fixed seed), so
memory stays bounded for WMT-size corpora.

With `data.corpora` the tokenizer is trained on every corpus's training text (each capped
by its own train_limit) and is joint over all their languages; the key covers every corpus's
fingerprint and direction. Tags (`mtrain.data.tags.reserved_symbols`: `<2en>`, `<bt>`) are
SentencePiece user-defined symbols, so each is one piece that plain text never produces; a
symbol that occurs in the training text would be ambiguous and is refused, naming its key.

A trained model file names no path: SentencePiece records where its training text and
output were (`trainer_spec.input`, `model_prefix`), the staging directory of one build, and
those are rewritten to bare file names. So the same tokenizer built on two machines, or in
two caches, is the same bytes, and the fingerprint that keys encoded corpora is the same.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from mtrain.config import DataConfig, TokenizerConfig, TokenizerModel
from mtrain.data.cache import build_entry, cache_root, fingerprint, is_complete
from mtrain.data.cleaning import normalizer
from mtrain.data.corpora import TrainingCorpus
from mtrain.data.sources import ParallelSource, ReadStats, resolve_source
from mtrain.data.tags import corpus_tag, reserved_symbols
from mtrain.errors import MtrainError
from mtrain.tokenizer.tokenizer import JOINT_MODEL, SRC_MODEL, TGT_MODEL, Tokenizer

CACHE_FORMAT = 1  # bump when the way models are trained changes
SAMPLING_SEED = 1  # SentencePiece's sentence sampling, fixed so retraining is reproducible


def check_tokenizer_config(cfg: TokenizerConfig) -> None:
    if cfg.model_type not in tuple(TokenizerModel):
        raise MtrainError(f"tokenizer.model_type={cfg.model_type}: expected unigram or bpe")
    special = {"unk_id": cfg.unk_id, "pad_id": cfg.pad_id, "bos_id": cfg.bos_id, "eos_id": cfg.eos_id}
    if len(set(special.values())) != 4 or min(special.values()) < 0:
        raise MtrainError(f"tokenizer special ids {special}: need four distinct non-negative ids")
    if max(special.values()) >= cfg.vocab_size:
        raise MtrainError(f"tokenizer.vocab_size={cfg.vocab_size} must exceed every special id {special}")
    if not 0.0 < cfg.character_coverage <= 1.0:
        raise MtrainError(f"tokenizer.character_coverage={cfg.character_coverage}: expected a value in (0, 1]")
    if cfg.max_sentences <= 0:
        raise MtrainError(f"tokenizer.max_sentences={cfg.max_sentences}: expected a positive number")


def load_given_tokenizer(path: str, log: Callable[[str], Any] = print) -> Tokenizer:
    """`tokenizer.path`: a run directory (its tokenizer/), a tokenizer/ folder or a cache entry."""
    directory = Path(path).expanduser()
    if (directory / "tokenizer").is_dir():
        directory = directory / "tokenizer"
    try:
        tokenizer = Tokenizer.load(directory)
    except MtrainError as error:
        raise MtrainError(f"tokenizer.path={path}: {error}") from None
    log(f"tokenizer: the given one in {directory} (tokenizer.path; nothing trained)")
    return tokenizer


def train_or_load_tokenizer(
    cfg: TokenizerConfig,
    data: DataConfig,
    source: ParallelSource | None = None,
    log: Callable[[str], Any] = print,
    corpora: Sequence[TrainingCorpus] = (),
) -> Tokenizer:
    """The tokenizer for `data` and `cfg`, from cache if possible. `corpora`: the training
    corpora of `data.corpora` (mtrain.data.corpora), each with its source resolved; without
    them the tokenizer is trained on `source` (data's own corpus, resolved here if not given)."""
    if cfg.path is not None:
        return load_given_tokenizer(cfg.path, log)
    check_tokenizer_config(cfg)
    symbols = reserved_symbols(data)
    if not corpora:
        source = source or resolve_source(data)
        corpora = [TrainingCorpus("data", data.name, data, source)]
        languages = sorted([data.src, data.tgt]) if cfg.joint else [data.src, data.tgt]
        inputs: list[Any] = [source.fingerprint("train"), languages, data.train_limit]
    else:
        languages = (
            sorted({lang for corpus in corpora for lang in corpus.direction})
            if cfg.joint
            else [corpora[0].cfg.src, corpora[0].cfg.tgt]
        )
        inputs = [
            [(corpus.source.fingerprint("train"), corpus.direction, corpus.cfg.train_limit) for corpus in corpora],
            languages,
        ]
    key = fingerprint(
        "tokenizer",
        CACHE_FORMAT,
        cfg,
        *inputs,
        data.clean.normalize,
        data.invalid_utf8,
        *([symbols] if symbols else []),  # no tags: the key (and cache entry) of a plain corpus as before
    )
    entry = cache_root(data.cache_dir) / "tokenizers" / f"{data.name}-{'-'.join(languages)}-{key[:16]}"
    if is_complete(entry):
        log(f"tokenizer: reusing {entry}")
        return Tokenizer.load(entry)

    start = time.perf_counter()
    with build_entry(entry, log) as staging:
        texts = _write_training_text(staging, corpora, data, symbols, joint=cfg.joint)
        for model_name, text_file in texts.items():
            _train_model(cfg, text_file, staging / model_name, symbols if model_name != TGT_MODEL else [])
            _forget_training_paths(staging / model_name, text_file)
            text_file.unlink()
    kind = "joint" if cfg.joint else "separate"
    log(
        f"tokenizer: trained {kind} {cfg.model_type} vocabulary of {cfg.vocab_size} in "
        f"{time.perf_counter() - start:.1f} s -> {entry}"
        + (f" (reserved symbols: {' '.join(symbols)})" if symbols else "")
    )
    return Tokenizer.load(entry)


def _write_training_text(
    staging: Path, corpora: Sequence[TrainingCorpus], data: DataConfig, symbols: list[str], joint: bool
) -> dict[str, Path]:
    """Stream the training sentences of every corpus into text file(s); returns {model file name: text file}.
    Each pair is written in sorted language order (a joint vocabulary does not depend on the direction)."""
    normalize = normalizer(data.clean.normalize)
    if joint:
        texts = {JOINT_MODEL: staging / "joint.txt"}
    else:
        texts = {SRC_MODEL: staging / "src.txt", TGT_MODEL: staging / "tgt.txt"}
    handles = {name: open(path, "w", encoding="utf-8") for name, path in texts.items()}
    pairs_read = 0
    try:
        for corpus in corpora:
            stats = ReadStats()
            swap = joint and corpus.cfg.src > corpus.cfg.tgt
            for line, (src, tgt) in enumerate(
                itertools.islice(corpus.source.pairs("train", stats), corpus.cfg.train_limit), start=1
            ):
                first, second = (tgt, src) if swap else (src, tgt)
                for position, sentence in enumerate((first, second)):
                    if not sentence:
                        continue
                    if symbols and "<" in sentence:
                        _refuse_a_symbol_in_text(sentence, symbols, data, corpus, line)
                    out = handles[JOINT_MODEL] if joint else handles[SRC_MODEL if position == 0 else TGT_MODEL]
                    out.write(normalize(sentence) + "\n")
            pairs_read += stats.pairs
    finally:
        for handle in handles.values():
            handle.close()
    if pairs_read == 0 or any(path.stat().st_size == 0 for path in texts.values()):
        where = corpora[0].source.description if len(corpora) == 1 else "the corpora of data.corpora"
        raise MtrainError(f"{where}: the train split has no text to train a tokenizer on")
    return texts


def _refuse_a_symbol_in_text(
    sentence: str, symbols: list[str], data: DataConfig, corpus: TrainingCorpus, line: int
) -> None:
    """A tag symbol that real text contains would be read as the tag: name the key that made it."""
    for symbol in symbols:
        if symbol in sentence:
            keys = [
                f"data.corpora[{index}].tag"
                for index, entry in enumerate(data.corpora)
                if entry.tag and corpus_tag(entry.tag) == symbol
            ]
            key = keys[0] if keys else "data.lang_tags"
            raise MtrainError(
                f"{key}: the tag symbol {symbol} occurs in the training text of {corpus.key} (name "
                f"{corpus.label}, pair {line}); choose a tag that real text never contains"
            )


def _train_model(cfg: TokenizerConfig, text_file: Path, model_file: Path, symbols: Sequence[str] = ()) -> None:
    spm.set_random_generator_seed(SAMPLING_SEED)
    # Passed only when there are tags, so a corpus without them trains exactly as before.
    reserved: dict[str, Any] = {"user_defined_symbols": list(symbols)} if symbols else {}
    try:
        spm.SentencePieceTrainer.train(
            input=str(text_file),
            model_prefix=str(model_file.with_suffix("")),
            vocab_size=cfg.vocab_size,
            model_type=cfg.model_type,
            character_coverage=cfg.character_coverage,
            input_sentence_size=cfg.max_sentences,
            shuffle_input_sentence=True,
            unk_id=cfg.unk_id,
            pad_id=cfg.pad_id,
            bos_id=cfg.bos_id,
            eos_id=cfg.eos_id,
            num_threads=cfg.num_threads,
            minloglevel=2,  # errors only: its progress log would drown ours
            **reserved,
        )
    except RuntimeError as error:
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise MtrainError(
            f"tokenizer (vocab_size={cfg.vocab_size}, model_type={cfg.model_type}): SentencePiece "
            f"training failed ({message}); {sentencepiece_hint(message)}"
        ) from error


def _forget_training_paths(model_file: Path, text_file: Path) -> None:
    """Rewrite the paths SentencePiece stored in `model_file` as bare file names (see the
    module docstring); nothing that encoding or decoding reads is changed."""
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(model_file.read_bytes())
    del model.trainer_spec.input[:]
    model.trainer_spec.input.append(text_file.name)
    model.trainer_spec.model_prefix = model_file.stem
    model_file.write_bytes(model.SerializeToString(deterministic=True))


def sentencepiece_hint(message: str) -> str:
    """What to change for a SentencePiece training error, from its message."""
    too_high = re.search(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)", message)
    if too_high:
        return (
            f"the corpus has too few distinct pieces for {too_high.group(1)}: lower tokenizer.vocab_size "
            f"to at most {too_high.group(2)}"
        )
    if "smaller than required_chars" in message or "increase vocab_size" in message.lower():
        return "the corpus has more characters than the vocabulary can hold: raise tokenizer.vocab_size or lower tokenizer.character_coverage"
    if "sentences_.empty()" in message:
        return (
            "no line of the training text was usable: every line is longer than SentencePiece accepts "
            "(4,192 bytes). A file with CR-only line ends, or all text on one line, reads as one giant "
            "line: give the corpus one sentence per line with LF or CRLF line ends"
        )
    return "check the training text, or change tokenizer.vocab_size"
