"""Inline markup (`format=xml|html`): tags out before translation, back in by the alignments.

`parse_markup` reads one line with the standard library's parsers (html.parser finds the tags
and their exact source text, quoted `>` in attributes included; for xml, expat also checks that
the line is well-formed XML) into its plain text and its tags: element spans over source word
ranges, and point tags (self-closing `<x id="1"/>`, HTML void elements such as `<br>`,
comments) before a source word. Words are whitespace-separated tokens of the plain text, the
words of `decode.alignment=word`. Text entities are decoded for the model (`&amp;` is `&`) and
the output's text is escaped again (`&`, `<`, `>`); every tag is written back exactly as it
was in the source (attributes and their entities untouched). An element starting or ending
inside a word spans that whole word (`<b>Hut</b>.` covers `Hut.`); a point tag inside a word
(`Hallo<br>Welt`) separates two words. Whitespace is collapsed to single spaces.

`restore_markup` puts the tags around the target words aligned to the source words they
covered: an element spans from its first to its last aligned target word. The result always
nests: an element is clipped to its parent's target range and to what the siblings placed before
left, and an element with no aligned word left (nothing aligned, or clipped away) is written
empty (`<b></b>`) where its first source word's neighbours land. So every source tag is in
the output, once, and the output is well-formed whenever the input was.

Malformed input (an end tag that closes nothing or crosses another element, an element left
open, and for xml whatever expat refuses) raises `MarkupError` saying why; `mtrain translate`
reports it with the file and line, `mtrain serve` with the sentence's index.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from xml.parsers import expat

from mtrain.errors import MtrainError

# HTML elements that never have content or an end tag (the WHATWG list).
VOID_ELEMENTS = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()  # noqa: SIM905
)
FORMATS = ("xml", "html")


class MarkupError(MtrainError):
    """A line whose markup cannot be taken apart and put back."""


@dataclass
class Element:
    """A tag pair over source words [start, end) (start == end: no word inside), with the
    elements and point tags inside it."""

    open_tag: str
    close_tag: str
    name: str = ""  # as html.parser reports it (lowercase), to match the end tag
    start: int = 0
    end: int = 0
    children: list[Element | Point] = field(default_factory=list)


@dataclass
class Point:
    """A tag with no content (self-closing, void, comment) before source word `position`."""

    text: str
    position: int


@dataclass
class Markup:
    """A line taken apart: the plain `text` to translate and the tags (`root.children`)."""

    text: str
    root: Element


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _TagScanner(HTMLParser):
    """Events in order: ("text", raw) | ("start", raw, name) | ("end", raw, name) | ("point", raw)."""

    def __init__(self, line: str, xml: bool) -> None:
        super().__init__(convert_charrefs=False)
        self.line, self.xml = line, xml
        self.events: list[tuple[str, ...]] = []

    def _offset(self) -> int:
        return self.getpos()[1]  # one line: the column is the offset

    def handle_starttag(self, tag: str, attrs: object) -> None:
        raw = self.get_starttag_text() or ""
        void = not self.xml and tag in VOID_ELEMENTS
        self.events.append(("point", raw) if void else ("start", raw, tag))

    def handle_startendtag(self, tag: str, attrs: object) -> None:
        self.events.append(("point", self.get_starttag_text() or ""))

    def handle_endtag(self, tag: str) -> None:
        start = self._offset()
        end = self.line.find(">", start)
        raw = self.line[start : end + 1] if end >= 0 else self.line[start:]
        if not self.xml and tag in VOID_ELEMENTS:
            return  # `</br>` is dropped by browsers too; `<br>` stands alone
        self.events.append(("end", raw, tag))

    def _raw_until(self, opener: str, closer: str) -> None:
        start = self._offset()
        end = self.line.find(closer, start + len(opener))
        self.events.append(("point", self.line[start : end + len(closer)] if end >= 0 else self.line[start:]))

    def handle_comment(self, data: str) -> None:
        self._raw_until("<!--", "-->")

    def handle_decl(self, decl: str) -> None:
        self._raw_until("<!", ">")

    def handle_pi(self, data: str) -> None:
        self._raw_until("<?", ">")

    def handle_data(self, data: str) -> None:
        self.events.append(("text", data))

    def handle_entityref(self, name: str) -> None:
        self.events.append(("text", f"&{name};"))

    def handle_charref(self, name: str) -> None:
        self.events.append(("text", f"&#{name};"))


def _check_xml(line: str) -> None:
    """expat's verdict on the line as the content of an element (so several top-level
    elements and bare text are fine)."""
    parser = expat.ParserCreate()
    try:
        parser.Parse(f"<mtrain-line>{line}</mtrain-line>", True)
    except expat.ExpatError as error:
        column = min(max(error.offset - len("<mtrain-line>"), 0), len(line))
        raise MarkupError(f"not well-formed XML at column {column + 1}: {expat.ErrorString(error.code)}") from None


def parse_markup(line: str, fmt: str) -> Markup:
    """The plain text and tags of one line of `fmt` ("xml" or "html"); MarkupError if malformed."""
    if fmt not in FORMATS:
        raise MtrainError(f"format={fmt}: choose xml or html")
    scanner = _TagScanner(line, xml=fmt == "xml")
    scanner.feed(line)
    scanner.close()
    root = Element("", "")
    stack = [root]
    text_parts: list[str] = []

    def words_so_far() -> int:
        return len("".join(text_parts).split())

    def in_word() -> bool:  # the text so far ends inside a word: a tag here splits it
        joined = "".join(text_parts)
        return bool(joined) and not joined[-1].isspace()

    for event in scanner.events:
        kind = event[0]
        if kind == "text":
            text_parts.append(html.unescape(event[1]))
        elif kind == "point":
            if in_word():
                text_parts.append(" ")  # `a<br/>b`: two words, the tag between them
            stack[-1].children.append(Point(event[1], words_so_far()))
        elif kind == "start":
            # A tag inside a word (`un<b>fair</b>`, `<b>Hut</b>.`) spans the whole word: the
            # model reads the text as written, and tags land on word boundaries.
            start = words_so_far() - 1 if in_word() else words_so_far()
            element = Element(event[1], "", name=event[2], start=start)
            stack[-1].children.append(element)
            stack.append(element)
        else:  # end
            name = event[2]
            if len(stack) == 1 or stack[-1].name != name:
                why = f"closes <{stack[-1].name}>" if len(stack) > 1 else "closes no open element"
                raise MarkupError(f"end tag {event[1]} {why}")
            element = stack.pop()
            element.close_tag = event[1]
            element.end = words_so_far()
    if len(stack) > 1:
        raise MarkupError(f"element {stack[-1].open_tag} is never closed")
    if fmt == "xml":  # after the nesting (whose messages are clearer): what else XML forbids
        _check_xml(line)
    return Markup(" ".join("".join(text_parts).split()), root)


def _tag_sets(element: Element) -> list[str]:
    tags = []
    for child in element.children:
        if isinstance(child, Point):
            tags.append(child.text)
        else:
            tags += [child.open_tag, *_tag_sets(child), child.close_tag]
    return tags


def tags_of(markup: Markup) -> list[str]:
    """Every tag of the line as written, in document order (tests compare them as multisets)."""
    return _tag_sets(markup.root)


@dataclass
class _Placed:
    """A node's target range [start, end) (start == end: empty) and its placed children."""

    node: Element | Point
    start: int
    end: int
    children: list[_Placed] = field(default_factory=list)


def _target_range(
    start: int, end: int, links: dict[int, list[int]], bounds: tuple[int, int], anchor: int
) -> tuple[int, int]:
    """Target words aligned to source words [start, end), clipped to `bounds`; when none,
    the empty range at `anchor` (clipped too)."""
    targets = [j for i in range(start, end) for j in links.get(i, ())]
    low, high = bounds
    if targets:
        first, last = max(min(targets), low), min(max(targets) + 1, high)
        if first < last:
            return first, last
    position = min(max(anchor, low), high)
    return position, position


def _anchor(position: int, links: dict[int, list[int]], num_src: int, num_tgt: int) -> int:
    """Where a tag before source word `position` lands in the target: before the first target
    word of that source word, else after the last of the word before, else proportionally."""
    if position in links:
        return min(links[position])
    if position - 1 in links:
        return max(links[position - 1]) + 1
    return round(position * num_tgt / max(num_src, 1))


def _place(
    element: Element, bounds: tuple[int, int], links: dict[int, list[int]], num_src: int, num_tgt: int
) -> list[_Placed]:
    """The target ranges of `element`'s children within `bounds`, recursively."""
    placed: list[_Placed] = []
    spans = []
    for order, child in enumerate(element.children):
        if isinstance(child, Point):
            position = min(max(_anchor(child.position, links, num_src, num_tgt), bounds[0]), bounds[1])
            placed.append(_Placed(child, position, position))
            continue
        anchor = _anchor(child.start, links, num_src, num_tgt)
        start, end = _target_range(child.start, child.end, links, bounds, anchor)
        spans.append((start, order, end, child))
    # Siblings may not overlap. In the order their words land in the target (translation may
    # swap them), each starts where the previous one ended; one left with no word is empty.
    cursor = bounds[0]
    for start, _, end, child in sorted(spans, key=lambda span: span[:2]):
        start = max(start, cursor)
        end = max(end, start)
        node = _Placed(child, start, end)
        node.children = _place(child, (start, end), links, num_src, num_tgt)
        placed.append(node)
        cursor = max(cursor, end)
    return placed


def _source_start(node: Element | Point) -> int:
    return node.position if isinstance(node, Point) else node.start


def _render(placed: Sequence[_Placed], bounds: tuple[int, int], words: Sequence[str]) -> list[tuple[str, bool]]:
    """Pieces of output over target words [bounds): (text, is_word_bearing)."""
    pieces: list[tuple[str, bool]] = []
    # Empty nodes at a position come before the node that starts there, in source order.
    ordered = sorted(placed, key=lambda p: (p.start, p.end > p.start))
    index = 0
    position = bounds[0]
    while position < bounds[1] or index < len(ordered):
        if index < len(ordered) and ordered[index].start <= position:
            node = ordered[index]
            index += 1
            if isinstance(node.node, Point):
                pieces.append((node.node.text, False))
            else:
                inner = _join(_render(node.children, (node.start, node.end), words))
                text = f"{node.node.open_tag}{inner}{node.node.close_tag}"
                pieces.append((text, node.end > node.start))
                position = max(position, node.end)
            continue
        if position >= bounds[1]:
            break
        pieces.append((_escape(words[position]), True))
        position += 1
    return pieces


def _join(pieces: Sequence[tuple[str, bool]]) -> str:
    """Word-bearing pieces separated by spaces; an empty tag is glued to what follows it."""
    out, space_due = "", False
    for text, word_bearing in pieces:
        if space_due:
            out += " "
        out += text
        space_due = word_bearing
    return out


def restore_markup(markup: Markup, translation: str, links: Sequence[tuple[int, int]]) -> str:
    """The translation (plain text) with the source's tags put back by word `links`
    ((source word, target word) pairs, as `decode.alignment=word` gives them)."""
    words = translation.split()
    aligned: dict[int, list[int]] = {}
    for i, j in links:
        if 0 <= j < len(words):
            aligned.setdefault(i, []).append(j)
    num_src = len(markup.text.split())
    placed = _place(markup.root, (0, len(words)), aligned, num_src, len(words))
    return _join(_render(placed, (0, len(words)), words))


def strip_markup(line: str, fmt: str) -> str:
    """The plain text of a line of markup (what scores compare)."""
    return parse_markup(line, fmt).text
