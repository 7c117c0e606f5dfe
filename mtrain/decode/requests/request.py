"""One sentence's request, the one object that carries it from the parsed input to its result.

A `DecodeRequest` is made where the input is read (a line of `mtrain translate`, a sentence of
eval's split, an item of the JSON API's `text`, a line of LibreTranslate's `q`) and goes on
through the request pipeline (`mtrain.decode.requests.pipeline`): `prepare` returns it with
what it found (the text without its tags, the glossary's terms among its constraints), the
server's batcher queues it as it is, `decode` encodes it (its source ids and target controls,
`ControlIds`, which the engine and the search take per sentence), and `finish` reads it to put
the tags back and count what the controls did (Sockeye carries one `TranslatorInput` so).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtrain.decode.requests.markup import Markup


@dataclass
class DecodeRequest:
    """One sentence and what its translation must start with, contain and avoid, as text; then
    what the pipeline's steps found."""

    text: str  # as given (with its inline tags, for format=xml|html)
    prefix: str = ""
    constraints: tuple[str, ...] = ()  # prepared: the glossary's terms found in it added
    avoid: tuple[str, ...] = ()  # prepared: the words its terms replace added (decode.term_avoid_replaced)
    ordered: bool = False  # the constraints must appear in this order
    where: str = ""  # how messages name it: `input.de:3`, `text[2]`
    # Found by `prepare`:
    source: str | None = None  # the text decoded (its tags taken out); None: not prepared, `text` itself
    markup: Markup | None = None  # its tags, put back by `finish`
    terms: tuple[str, ...] = ()  # the glossary's target terms among `constraints`
    term_words: dict[str, list[int]] = field(default_factory=dict)  # target term -> its source words (placement)
    # Found by `decode`:
    ids: list[int] | None = None  # the source ids decoded (eos last; None: blank)
    cut: bool = False  # the source was cut to the input limit

    @property
    def plain(self) -> str:
        """The text the model translates (without inline tags once prepared)."""
        return self.text if self.source is None else self.source

    @property
    def controlled(self) -> bool:
        """It asks something of its output: a prefix, constraints or avoided phrases."""
        return bool(self.prefix.strip() or self.constraints or self.avoid)
