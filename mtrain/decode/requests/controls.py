"""What a user asks of one sentence's output, as text, and its target token ids.

A sentence's request (`DecodeRequest`, mtrain.decode.requests.request) holds its target
prefix, the phrases its output must contain and those it must not, as typed; `encode_request`
turns them into `ControlIds`, what the engine and the search take per sentence
(`mtrain.decode.search.constraints`). Where the text comes from:

- `mtrain translate`: `prefix=FILE` (one line per input line; a blank line: no prefix),
  `constraints=unordered|ordered` (input lines are fairseq's `source<TAB>phrase<TAB>...`),
  `terms=FILE.tsv` (`mtrain.decode.requests.terminology`), `avoid=FILE` (one phrase per line, for
  every sentence);
- `mtrain serve`: the request's `prefix`, `constraints`, `avoid` and `terms` fields, and the
  server's glossary (`terms=FILE.tsv`).

Phrases are matched as target tokens. A phrase is tokenized on its own, as a word that
follows a space: SentencePiece gives its first piece the word-start marker `▁` (`Hund` ->
`▁Hund`). Its pieces never cross a space (whitespace splitting, SentencePiece's default), so
a word after a space is segmented in a sentence exactly as on its own: a constraint asks for
the phrase as whole words (it also ends a word: `mtrain.decode.search.constraints`), and an avoided
phrase bans its tokens, which start a word (a word that merely contains it, `Haushund`,
tokenizes otherwise and is not banned; nor is a word glued to a punctuation mark before it,
`(Hund`, whose pieces lack the marker; a longer word whose pieces start with the phrase's,
`dogs` as `▁dog s`, is banned with it). Matching is exact: case and spelling count. The prefix is tokenized as the start
of the output it is, with the same marker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtrain.data.bounded_lines import count_lines
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.requests.terminology import Glossary, read_glossary
from mtrain.decode.requests.text_files import read_text_lines
from mtrain.decode.search.constraints import ControlIds
from mtrain.errors import MtrainError
from mtrain.tokenizer import Tokenizer

PhraseEncoder = Callable[[str], list[int]]


def phrase_encoder(tokenizer: Tokenizer, model: Any) -> PhraseEncoder:
    """How phrases and prefixes become target ids for `model` (mtrain's model, an ensemble, or
    an engine): `tokenizer.encode_tgt`, restricted to the pieces the model can emit when its
    softmax ranges over a subset (`model.output_vocab=target`; an ensemble: the pieces every
    member can emit). A piece outside that subset has probability 0: a prefix or constraint
    holding one could never be written, so it is segmented into allowed pieces instead (the
    same pieces as before for every word of the training targets)."""
    allowed = emittable_ids(model)
    return tokenizer.encode_tgt if allowed is None else tokenizer.target_encoder_within(allowed)


def emittable_ids(model: Any) -> list[int] | None:
    """The target ids `model`'s softmax ranges over; None: all of them (or not known: CTranslate2)."""
    model = getattr(model, "model", model)  # a TorchEngine's model
    allowed: torch.Tensor | None = None
    for member in getattr(model, "members", None) or [model]:
        member_allowed = getattr(member, "output_allowed", None)
        if isinstance(member_allowed, torch.Tensor):
            mask = member_allowed.bool().cpu()
            allowed = mask if allowed is None else allowed & mask
    return None if allowed is None else allowed.nonzero().squeeze(1).tolist()


def encode_request(
    tokenizer: Tokenizer,
    request: DecodeRequest | None,
    encode: PhraseEncoder | None = None,
    term_sources: dict[str, tuple[int, ...]] | None = None,
    sentence_ends: int = 0,
) -> ControlIds | None:
    """The request's prefix, constraints and avoided phrases as target ids (blank phrases
    dropped); None when it asks for nothing.
    `encode`: a `phrase_encoder` for the model that decodes (default: `tokenizer.encode_tgt`).
    `term_sources`: the source pieces of the terms among the constraints (by their text) and
    `sentence_ends` the source's sentence-final marks, for term placement (mtrain.decode.search.placement)."""
    if request is None:
        return None
    encode = encode or tokenizer.encode_tgt

    def encoded(texts: Sequence[str]) -> list[tuple[str, tuple[int, ...]]]:
        pairs = ((text, tuple(encode(" ".join(text.split())))) for text in texts if text.strip())
        return [(text, ids) for text, ids in pairs if ids]

    constraints = encoded(request.constraints)
    sources = tuple((term_sources or {}).get(text, ()) for text, _ in constraints)
    controls = ControlIds(
        prefix=tuple(encode(request.prefix)) if request.prefix.strip() else (),
        constraints=tuple(ids for _, ids in constraints),
        avoid=tuple(ids for _, ids in encoded(request.avoid)),
        ordered=request.ordered,
        term_sources=sources if any(sources) else (),
        sentence_ends=sentence_ends if any(sources) else 0,
    )
    return None if controls.empty else controls


def split_constraints(line: str) -> tuple[str, tuple[str, ...]]:
    """fairseq's `--constraints` input: the source, then the phrases, tab-separated."""
    source, *phrases = line.split("\t")
    return source, tuple(phrase for phrase in phrases if phrase.strip())


@dataclass(frozen=True)
class LineControls:
    """How `mtrain translate` builds each line's request (all off: lines are plain sources)."""

    tabbed_constraints: bool = False  # lines are `source<TAB>phrase...`
    ordered: bool = False
    glossary: Glossary | None = None
    avoid: tuple[str, ...] = ()

    @property
    def any(self) -> bool:
        return self.tabbed_constraints or self.glossary is not None or bool(self.avoid)

    def request(self, line: str, prefix: str = "", where: str = "") -> DecodeRequest:
        """An input line's request, with its prefix line; the glossary's terms are found later,
        in the text without its markup (the request pipeline, mtrain.decode.requests.pipeline)."""
        source, phrases = split_constraints(line) if self.tabbed_constraints else (line, ())
        return DecodeRequest(source, prefix, phrases, self.avoid, self.ordered, where)


def describe_controls(
    controls: LineControls,
    prefix: str | None = None,
    terms: str | None = None,
    avoid: str | None = None,
    markup: str = "text",
) -> str:
    """The controls of a run, for its start line (`terms glossary.tsv (42 terms)`); "" for none."""
    parts = []
    if prefix is not None:
        parts.append(f"prefixes from {prefix}")
    if controls.tabbed_constraints:
        parts.append("constraints in the input" + (" (ordered)" if controls.ordered else ""))
    if controls.glossary is not None:
        count = len(controls.glossary.targets)
        parts.append(f"terms {terms} ({count} term{'s' if count != 1 else ''})")
    if controls.avoid:
        count = len(controls.avoid)
        parts.append(f"avoiding {count} phrase{'s' if count != 1 else ''}" + (f" ({avoid})" if avoid else ""))
    if markup != "text":
        parts.append(f"format={markup}")
    return ", ".join(parts)


def read_phrases(path: str | Path, key: str = "avoid") -> tuple[str, ...]:
    """A file of phrases, one per line (blank lines and lines starting with `#` skipped; a
    byte-order mark and CRLF line ends as in `text_files.read_text_lines`)."""
    lines = read_text_lines(path, key)
    return tuple(" ".join(line.split()) for line in lines if line.strip() and not line.startswith("#"))


def line_controls(constraints: str, terms: str | None, terms_ignore_case: bool, avoid: str | None) -> LineControls:
    """`mtrain translate`'s settings (`constraints` none|unordered|ordered) read into a
    LineControls: the glossary and the avoided phrases are read (and checked) here."""
    return LineControls(
        tabbed_constraints=constraints != "none",
        ordered=constraints == "ordered",
        glossary=read_glossary(terms, terms_ignore_case) if terms is not None else None,
        avoid=read_phrases(avoid) if avoid is not None else (),
    )


def check_prefix_lines(prefix: str, input_path: str | None) -> None:
    """prefix= has as many lines as input= (files; stdin, devices and pipes are checked as they are read)."""
    if input_path is None:
        return
    wanted, given = count_lines(input_path), count_lines(prefix)
    if wanted is not None and given is not None and wanted != given:
        raise MtrainError(
            f"prefix={prefix}: {given} lines, input={input_path} has {wanted}; "
            "give one prefix line per input line (a blank line: no prefix)"
        )
