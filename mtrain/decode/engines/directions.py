"""Which direction a decode translates: the languages a run translates into, and the tags that
choose one.

A run trained with `data.lang_tags` starts every source with the target language's tag
(`<2fr>`, mtrain.data.tags); to translate into French, decoding puts `<2fr>` there too, and
the model, which has seen that tag only before French targets, answers in French: one model,
several directions (Johnson et al. 2017). `RunLanguages` answers, from a run's data config,
which languages a request may name (`tgt_lang` of translate, eval and serve) and gives the
tokenizer of a direction (`Tokenizer.with_tags`): its `encode_src` starts every source with
the direction's tag ids, and every tag id of the run is banned from the output (the generator
and the CTranslate2 engine read `tokenizer.tag_ids`), so a tag reaches the encoder and never
the output. A run without lang_tags translates into its one target language, untagged.

The source language needs no tag: a run with lang_tags translates from any language it has
seen into any of its target languages, the directions it never trained included (zero-shot,
e.g. de->fr from de->en, en->de, fr->en, en->fr).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import OmegaConf

from mtrain.config import CorpusConfig, DataConfig, source_with_several_targets
from mtrain.data.tags import Direction, reserved_symbols, run_directions, source_tags
from mtrain.errors import MtrainError
from mtrain.tokenizer import Tokenizer


def data_config(stored: Any) -> DataConfig:
    """What a run's stored `data` section (a checkpoint's or config.yaml's: a node, a dict or a
    DataConfig) says about its directions: src, tgt, lang_tags and each corpus's src, tgt and
    tag; keys a run written before multilingual runs lacks take their defaults."""
    if isinstance(stored, DataConfig):
        return stored
    stored = OmegaConf.to_container(stored, resolve=True) if OmegaConf.is_config(stored) else dict(stored or {})
    defaults = DataConfig()
    corpora = [
        CorpusConfig(src=corpus.get("src"), tgt=corpus.get("tgt"), tag=corpus.get("tag"))
        for corpus in stored.get("corpora") or []
    ]
    return DataConfig(
        src=str(stored.get("src", defaults.src)),
        tgt=str(stored.get("tgt", defaults.tgt)),
        lang_tags=bool(stored.get("lang_tags", False)),
        corpora=corpora,
    )


@dataclass(frozen=True)
class RunLanguages:
    """The directions a run trained (from its data config) and what decoding each needs."""

    data: DataConfig

    @classmethod
    def of(cls, stored: Any) -> RunLanguages:
        """From a run's stored `data` section (`data_config`)."""
        return cls(data_config(stored))

    @property
    def lang_tags(self) -> bool:
        return bool(self.data.lang_tags)

    def directions(self) -> list[Direction]:
        return run_directions(self.data)

    def target_languages(self) -> list[str]:
        """The languages `tgt_lang` may name, in the order the run's directions name them."""
        languages: list[str] = []
        for _, tgt in self.directions():
            if tgt not in languages:
                languages.append(tgt)
        return languages

    def target(self, requested: str | None, key: str = "tgt_lang") -> str:
        """The language to translate into: `requested`, or (null) the run's one target
        language; MtrainError naming `key` for a language the run does not translate into, or
        for null when it translates into several."""
        languages = self.target_languages()
        listed = ", ".join(languages)
        ambiguous = None if self.lang_tags else source_with_several_targets(self.directions())
        if ambiguous is not None:  # trained before `mtrain fit` refused such a config
            raise MtrainError(
                f"{key}: this run translates {ambiguous[0]} into {' and '.join(ambiguous[1])} without "
                "language tags (data.lang_tags=false), so nothing tells it which to write and every "
                f"{key} would give the same output; train it again with data.lang_tags=true"
            )
        if requested is None:
            if len(languages) == 1:
                return languages[0]
            how = (
                "data.lang_tags"
                if self.lang_tags
                else "each from its own source language, without language tags: the input's language decides"
            )
            raise MtrainError(
                f"{key}: this run translates into {listed} ({how}); choose one, e.g. {key}={languages[0]}"
            )
        if requested not in languages:
            trained = "" if self.lang_tags else " (it has no language tags: data.lang_tags=false)"
            raise MtrainError(
                f"{key}={requested}: this run does not translate into {requested!r}{trained}; choose one of: {listed}"
            )
        return requested

    def direction(self, src: str | None, tgt: str | None) -> Direction:
        """The direction `mtrain eval src_lang= tgt_lang=` scores: one the run trained, or (with
        lang_tags) any source language into one of its target languages (zero-shot). A null
        side is the only one the run's directions allow; MtrainError otherwise."""
        trained = self.directions()
        names = ", ".join(f"{s}->{t}" for s, t in trained)
        if src is None and tgt is None and len(trained) == 1:
            return trained[0]
        if tgt is None:
            targets = [t for s, t in trained if s == src] if src is not None else []
            if len(targets) != 1:
                raise MtrainError(
                    f"tgt_lang: this run trained {names}; name the direction to score, e.g. "
                    f"src_lang={trained[0][0]} tgt_lang={trained[0][1]}"
                )
            tgt = targets[0]
        tgt = self.target(tgt)
        if src is None:
            sources = [s for s, t in trained if t == tgt]
            if len(sources) != 1:
                raise MtrainError(
                    f"src_lang: this run trained {names}; name the source language, e.g. "
                    f"src_lang={sources[0]} tgt_lang={tgt}"
                )
            src = sources[0]
        if src == tgt:
            raise MtrainError(f"src_lang={src} tgt_lang={tgt}: the same language; choose two")
        if (src, tgt) not in trained and not self.lang_tags:
            raise MtrainError(
                f"src_lang={src} tgt_lang={tgt}: this run trained {names} without language tags "
                "(data.lang_tags=false), so it has no way to translate another direction"
            )
        return src, tgt

    def is_multilingual(self) -> bool:
        """Whether the run trained more than one direction (its reports name the direction)."""
        return len(self.directions()) > 1

    def tokenizer_for(self, tokenizer: Tokenizer, tgt: str, src: str | None = None, key: str = "tgt_lang") -> Tokenizer:
        """`tokenizer` for translating into `tgt` (a language of `target_languages`): the tag
        ids at the start of every source, every tag of the run banned from the output. An
        M2M100/NLLB tokenizer instead starts sources with the language token of `src` (by default
        the run's source language of that target) and forces the target's token first: `tgt` may
        be any language the model knows (a language it does not: refused naming `key` and the
        nearest codes)."""
        if tokenizer.fairseq:
            return tokenizer.with_languages(src or self.source_of(tgt), tgt, "src_lang", key)
        prefix = [tokenizer.symbol_id(symbol) for symbol in source_tags(self.data, tgt)]
        return tokenizer.with_tags(prefix, tokenizer.target_symbol_ids(reserved_symbols(self.data)))

    def model_targets(self, tokenizer: Tokenizer) -> list[str]:
        """The languages a request may name: the run's target languages, and for an M2M100/NLLB
        model every language it knows (one imported model translates into each)."""
        languages = self.target_languages()
        return languages + [code for code in tokenizer.language_codes() if code not in languages]

    def source_of(self, tgt: str) -> str:
        """The source language of the run's first direction into `tgt` (else of its first)."""
        directions = self.directions()
        return next((s for s, t in directions if t == tgt), directions[0][0])

    def reserving(self, tokenizer: Tokenizer) -> Tokenizer:
        """`tokenizer` with every tag of the run banned from the output and no source prefix:
        what an engine is built with before a request names its direction."""
        return tokenizer.with_tags((), tokenizer.target_symbol_ids(reserved_symbols(self.data)))


def single_direction(src: str, tgt: str) -> RunLanguages:
    """The languages of a run known only by its language pair (an old export directory)."""
    return RunLanguages(DataConfig(src=src, tgt=tgt))
