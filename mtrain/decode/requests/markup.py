"""Inline markup (`format=xml|html`): tags out before translation, back in by the alignments.

`parse_markup` reads one line into its plain text and its tags: element spans over source
word ranges, and point tags before a source word. Words are whitespace-separated tokens of the
plain text, the words of `decode.alignment=word`. The line is scanned once, left to right, by
this module's own tokenizer (each tag's exact source text is a slice of the line, so a quoted
`>` in an attribute is fine); for xml, expat also checks that the line is well-formed XML.
Nothing recurses: a line of any depth or length parses and places in time linear in its tags
(words: linear up to the log factor of the range queries).

What each kind of node becomes (docs/TRANSLATE.md has the table):
- an element (`<b>…</b>`): an element over the words it encloses; HTML void elements (`<br>`),
  self-closing tags (`<x id="1"/>`) and, in html, an end tag of a void element (`</br>`) or
  with no name (`</>`) are point tags;
- text: translated; entities are decoded for the model (`&amp;` is `&`) and the output's text
  is escaped again (`&`, `<`, `>`);
- a CDATA section (`<![CDATA[…]]>`, xml and html alike): its text is translated, taken
  literally (no entities), and written back inside a CDATA section: an element whose words
  are written unescaped (a `]]>` in a word is split across two sections);
- comments, processing instructions (xml: up to `?>`; html: up to the first `>`, as browsers
  read them), html's declarations (`<!DOCTYPE html>`, `<!x>`), html's bogus end tags
  (`</3>`), and html's `<script>…</script>` and `<style>…</style>` (their content is code):
  point tags, kept as written and not translated;
- xml: a document type declaration is refused (it cannot be inside a line of content).

Every tag is written back exactly as it was in the source (attributes and their entities
untouched). An element starting or ending inside a word spans that whole word (`<b>Hut</b>.`
covers `Hut.`); a point tag inside a word (`Hallo<br>Welt`) separates two words. Whitespace is
collapsed to single spaces.

`restore_markup` puts the tags around the target words aligned to the source words they
covered: an element spans from its first to its last aligned target word. The result always
nests: an element is clipped to its parent's target range and to what the siblings placed before
left, and an element with no aligned word left (nothing aligned, or clipped away) is written
empty (`<b></b>`) where its first source word's neighbours land. So every source tag is in
the output, once, the text of every word once, and the output is well-formed whenever the
input was.

The contract on line breaks: a line is one sentence. A `\\n` inside the text given to
`parse_markup` (not at its end) is refused (MarkupError naming its column): `mtrain translate`
reads lines, so it never passes one; `mtrain serve` answers 422 and the client sends each line
as a sentence of its own (the LibreTranslate API splits its text into lines itself). A `\\r`
is whitespace.

Malformed input (a tag, comment, CDATA section or declaration that never ends, an end tag that
closes nothing or crosses another element, an element left open, and for xml whatever expat
refuses, with a hint for a bare `&` or `<`) raises `MarkupError` saying why and where (the
column); `mtrain translate` reports it with the file and line, `mtrain serve` with the
sentence's index.
"""

from __future__ import annotations

import gc
import html
import re
from collections.abc import Generator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from xml.parsers import expat

import numpy as np

from mtrain.errors import MtrainError

# HTML elements that never have content or an end tag (the WHATWG list).
VOID_ELEMENTS = frozenset(
    "area base br col embed hr img input link meta param source track wbr".split()  # noqa: SIM905
)
# HTML elements whose content is not markup but code: kept whole, as a point tag.
RAW_TEXT_ELEMENTS = frozenset({"script", "style"})
FORMATS = ("xml", "html")
CDATA_OPEN, CDATA_CLOSE = "<![CDATA[", "]]>"

# A start or end tag as HTML tokenizes it: a name starting with a letter, then attributes whose
# values may be quoted (a `>` inside quotes is not the end). The attribute loop is possessive
# and every alternative consumes a character, so a tag is matched (or refused) in one pass.
_HTML_TAG = re.compile(
    r"""<(/?)([a-zA-Z][^\s/>]*)
    ((?:\s+ | /(?!>) | [^\s/>="'][^\s/>=]* (?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s>"'][^\s>]*)?)? )*+)
    (/?)>""",
    re.VERBOSE,
)
# A start or end tag as XML writes it (expat checks the rest). No `<` inside: a scan that
# fails stops at the next `<`, so failed attempts stay linear too.
_XML_TAG = re.compile(
    r"""<(/?)((?:[^\W\d]|[_:])[^\s/<>]*)
    ((?:[^<>"'/] | /(?!>) | "[^"<]*" | '[^'<]*')*+)
    (/?)>""",
    re.VERBOSE,
)
_COMMENT_END = re.compile(r"--!?>")
_ENTITY_OR_TAG_START = re.compile(r"[&<][\w#.:-]*\Z")

TEXT, CDATA_TEXT, START, END, POINT = "text", "cdata", "start", "end", "point"


class MarkupError(MtrainError):
    """A line whose markup cannot be taken apart and put back."""


@dataclass(slots=True)
class Element:
    """A tag pair over source words [start, end) (start == end: no word inside), with the
    elements and point tags inside it. `cdata`: a CDATA section (its words go back unescaped)."""

    open_tag: str
    close_tag: str
    name: str = ""  # html: lowercase, to match the end tag whatever its case
    start: int = 0
    end: int = 0
    children: list[Element | Point] = field(default_factory=list)
    cdata: bool = False


@dataclass(slots=True)
class Point:
    """A tag with no content (self-closing, void, comment, …) before source word `position`."""

    text: str
    position: int


@dataclass
class Markup:
    """A line taken apart: the plain `text` to translate and the tags (`root.children`)."""

    text: str
    root: Element


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _cdata_escape(text: str) -> str:
    return text.replace("]]>", "]]]]><![CDATA[>")  # the only thing a CDATA section cannot hold


def _excerpt(line: str, start: int) -> str:
    piece = line[start : start + 24]
    return piece + ("…" if len(line) > start + 24 else "")


def _never_ends(what: str, line: str, start: int, closer: str, also: str = "") -> MarkupError:
    return MarkupError(
        f"{what} at column {start + 1} ({_excerpt(line, start)}) never ends: close it with {closer}{also}"
    )


def _xml_error(line: str, start: int) -> MarkupError:
    """expat's verdict on a line the scanner could not read at `start` (or a plain one)."""
    _check_xml(line)
    return MarkupError(f"not well-formed XML at column {start + 1} ({_excerpt(line, start)})")


def _scan(line: str, xml: bool) -> Iterator[tuple[str, str, str]]:
    """The line's pieces in order, as (kind, text, name): text (raw, entities undecoded),
    cdata (a CDATA section's text, between its start and end), start, end and point tags."""
    tag = _XML_TAG if xml else _HTML_TAG
    position, length = 0, len(line)
    while position < length:
        at = line.find("<", position)
        if at < 0:
            yield TEXT, line[position:], ""
            return
        if at > position:
            yield TEXT, line[position:at], ""
        if line[at + 1 : at + 2] in ("!", "?"):
            position = yield from _markup_declaration(line, at, xml)
            continue
        match = tag.match(line, at)
        if match is None:
            end = _bogus_tag_end(line, at, xml)
            if end is None:
                yield TEXT, "<", ""
                position = at + 1
            else:
                yield POINT, line[at:end], ""
                position = end
            continue
        position = match.end()
        text = match.group()
        slash, name, self_closing = match.group(1, 2, 4)
        if not xml:
            name = name.lower()
            self_closing = text.endswith("/>")  # `<x a=b/>` too (its value is `b/`), as html.parser reads it
        if slash:
            void = not xml and name in VOID_ELEMENTS  # `</br>`: kept in place, as `</>`
            yield (POINT, text, "") if void else (END, text, name)
        elif self_closing or (not xml and name in VOID_ELEMENTS):
            yield POINT, text, ""
        elif not xml and name in RAW_TEXT_ELEMENTS:
            position = _raw_text_end(line, position, name, at)
            yield POINT, line[at:position], ""
        else:
            yield START, text, name


def _markup_declaration(line: str, at: int, xml: bool) -> Generator[tuple[str, str, str], None, int]:
    """The pieces of the `<!…` or `<?…` at `at` (a comment, a CDATA section, a processing
    instruction, a declaration); returns where it ends."""
    if line.startswith("<!--", at):
        end = _comment_end(line, at, xml)
        yield POINT, line[at:end], ""
        return end
    if line.startswith(CDATA_OPEN, at):
        found = line.find(CDATA_CLOSE, at + len(CDATA_OPEN))
        if found < 0:
            raise _never_ends("the CDATA section", line, at, CDATA_CLOSE)
        yield START, CDATA_OPEN, CDATA_OPEN
        yield CDATA_TEXT, line[at + len(CDATA_OPEN) : found], ""
        yield END, CDATA_CLOSE, CDATA_OPEN
        return found + len(CDATA_CLOSE)
    is_pi = line.startswith("<?", at)
    if xml and not is_pi:
        if line[at : at + 9].upper() == "<!DOCTYPE":
            raise MarkupError(
                f"a document type declaration at column {at + 1} cannot be inside a line of "
                "format=xml (it belongs before a document's first element): remove it"
            )
        raise _xml_error(line, at)
    closer = "?>" if xml else ">"  # html reads `<?…>` and `<!…>` up to the first `>`, as browsers do
    found = line.find(closer, at + 2)
    if found < 0:
        raise _never_ends("the processing instruction" if is_pi else "the declaration", line, at, closer)
    yield POINT, line[at : found + len(closer)], ""
    return found + len(closer)


def _comment_end(line: str, at: int, xml: bool) -> int:
    """The end of the comment starting at `at`: xml's `-->`; html's also `--!>`, and the
    abrupt `<!-->` and `<!--->` browsers accept."""
    if xml:
        found = line.find("-->", at + 4)
        end = found + 3 if found >= 0 else -1
    elif line.startswith(">", at + 4) or line.startswith("->", at + 4):
        end = line.index(">", at + 4) + 1
    else:
        match = _COMMENT_END.search(line, at + 4)
        end = match.end() if match is not None else -1
    if end < 0:
        raise _never_ends("the comment", line, at, "-->")
    return end


def _bogus_tag_end(line: str, at: int, xml: bool) -> int | None:
    """Where a `<` that is no tag of the scanner's ends: None when it is text (html: a `<`
    before no letter, `a < b`); html's `</>` and `</3 …>` end at the next `>` (point tags);
    MarkupError for a tag that never ends (html) or anything expat refuses (xml)."""
    if xml:
        raise _xml_error(line, at)
    following = line[at + 1 : at + 2]
    if following == "/":
        found = line.find(">", at + 2)
        if found < 0:
            raise _never_ends("the end tag", line, at, ">")
        if _ascii_letter(line[at + 2 : at + 3]):  # a name, but attributes that never end well
            raise _never_ends("the end tag", line, at, ">", " (and any quote it opens)")
        return found + 1
    if _ascii_letter(following):
        raise _never_ends("the tag", line, at, ">", " (and any quote it opens); a literal < is written &lt;")
    return None


def _ascii_letter(char: str) -> bool:
    return char.isascii() and char.isalpha()  # HTML's tags start with an ASCII letter; `<ä` is text


def _raw_text_end(line: str, start: int, name: str, at: int) -> int:
    """The end of html's `<script>…</script>` (or style) whose start tag ends at `start`."""
    match = re.compile(rf"</{name}[\s/>]", re.IGNORECASE).search(line, start)
    found = line.find(">", match.start()) if match is not None else -1
    if found < 0:
        raise MarkupError(f"<{name}> at column {at + 1} is never closed: end it with </{name}>")
    return found + 1


def _check_xml(line: str) -> None:
    """expat's verdict on the line as the content of an element (so several top-level
    elements and bare text are fine), with a hint for a bare `&` or `<`."""
    parser = expat.ParserCreate()
    try:
        parser.Parse(f"<mtrain-line>{line}</mtrain-line>", True)
    except expat.ExpatError as error:
        offset = min(max(error.offset - len("<mtrain-line>"), 0), len(line))
        reason = expat.ErrorString(error.code)
        raise MarkupError(f"not well-formed XML at column {offset + 1}: {reason}{_xml_hint(line, offset)}") from None


def _xml_hint(line: str, offset: int) -> str:
    """What to write instead, when expat's error is at a bare `&` or `<` or an entity XML lacks."""
    entity = re.match(r"&([\w.:-]+);", line[offset:])
    if entity is not None and entity.group(1) not in ("amp", "lt", "gt", "quot", "apos"):
        meant = html.unescape(entity.group())
        numeric = f" as &#{ord(meant)};" if len(meant) == 1 else " as a numeric reference"
        return (
            f"; XML defines only &amp; &lt; &gt; &quot; &apos; and numeric references: write "
            f"{entity.group()}{numeric}, or use format=html"
        )
    found = _ENTITY_OR_TAG_START.search(line, 0, offset) or _ENTITY_OR_TAG_START.search(line, 0, offset + 1)
    if found is None:
        return ""
    if found.group().startswith("&"):
        return (
            f"; the & at column {found.start() + 1} starts no entity: write a literal & as &amp; "
            "(or use format=html, which reads a bare & as text)"
        )
    return f"; the < at column {found.start() + 1} starts no tag: write a literal < as &lt;"


@contextmanager
def _no_cycle_collection() -> Iterator[None]:
    """The cyclic garbage collector paused: the trees built here hold no cycles (reference
    counting frees them), and on a line of 100,000 tags the collector's passes over the
    growing heap took two thirds of the time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class _Words:
    """The plain text as it is read, and how many words it holds so far (kept incrementally:
    re-counting the text at every tag made parsing quadratic)."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.count = 0
        self.in_word = False  # the text so far ends inside a word: a tag here touches it

    def add(self, text: str) -> None:
        if not text:
            return
        tokens = len(text.split())
        joins = self.in_word and not text[0].isspace() and tokens > 0
        self.count += tokens - joins
        self.parts.append(text)
        self.in_word = not text[-1].isspace()

    def split_word(self) -> None:
        if self.in_word:
            self.add(" ")


def parse_markup(line: str, fmt: str) -> Markup:
    """The plain text and tags of one line of `fmt` ("xml" or "html"); MarkupError if malformed
    or if it holds a line break (one line is one sentence: see the module's docstring)."""
    if fmt not in FORMATS:
        raise MtrainError(f"format={fmt}: choose xml or html")
    if "\n" in line.rstrip("\r\n"):  # a line's own end is whitespace
        raise MarkupError(
            f"a line break at column {line.index(chr(10)) + 1}: markup is read one line at a time; "
            "send each line as a sentence of its own"
        )
    with _no_cycle_collection():
        return _parse(line, fmt == "xml")


def _parse(line: str, xml: bool) -> Markup:
    root = Element("", "")
    stack = [root]
    words = _Words()
    for kind, text, name in _scan(line, xml):
        if kind == TEXT:
            words.add(html.unescape(text))
        elif kind == CDATA_TEXT:
            words.add(text)
        elif kind == POINT:
            words.split_word()  # `a<br/>b`: two words, the tag between them
            stack[-1].children.append(Point(text, words.count))
        elif kind == START:
            # A tag inside a word (`un<b>fair</b>`, `<b>Hut</b>.`) spans the whole word: the
            # model reads the text as written, and tags land on word boundaries.
            start = words.count - 1 if words.in_word else words.count
            element = Element(text, "", name=name, start=start, cdata=text == CDATA_OPEN)
            stack[-1].children.append(element)
            stack.append(element)
        else:  # end
            if len(stack) == 1 or stack[-1].name != name:
                why = f"closes <{stack[-1].name}>" if len(stack) > 1 else "closes no open element"
                raise MarkupError(f"end tag {text} {why}")
            element = stack.pop()
            element.close_tag = text
            element.end = words.count
    if len(stack) > 1:
        raise MarkupError(f"element {stack[-1].open_tag} is never closed")
    if xml:  # after the nesting (whose messages are clearer): what else XML forbids
        _check_xml(line)
    return Markup(" ".join("".join(words.parts).split()), root)


def _elements(root: Element) -> list[Element]:
    """Every element under `root`, in document order."""
    found: list[Element] = []
    pending: list[Element | Point] = list(reversed(root.children))
    while pending:
        node = pending.pop()
        if isinstance(node, Element):
            found.append(node)
            pending.extend(reversed(node.children))
    return found


def tags_of(markup: Markup) -> list[str]:
    """Every tag of the line as written, in document order (tests compare them as multisets)."""
    tags: list[str] = []
    pending: list[Element | Point | str] = list(reversed(markup.root.children))
    while pending:
        node = pending.pop()
        if isinstance(node, str):
            tags.append(node)  # an element's end tag, after its children
        elif isinstance(node, Point):
            tags.append(node.text)
        else:
            tags.append(node.open_tag)
            pending.append(node.close_tag)
            pending.extend(reversed(node.children))
    return tags


@dataclass(slots=True)
class _Placed:
    """A node's target range [start, end) (start == end: empty) and its placed children."""

    node: Element | Point
    start: int
    end: int
    children: list[_Placed] = field(default_factory=list)


def _aligned_extremes(
    elements: Sequence[Element], links: dict[int, list[int]], num_src: int
) -> list[tuple[int, int] | None]:
    """For each element, the first and last target word aligned to its source words (None:
    none is aligned): range minimum/maximum queries on sparse tables, O(1) per element."""
    if not elements:
        return []
    size = max(num_src, 1, *(element.end for element in elements))
    none_aligned = np.iinfo(np.int64).max
    lowest = np.full(size, none_aligned, dtype=np.int64)
    highest = np.full(size, -1, dtype=np.int64)
    for source, targets in links.items():
        if 0 <= source < size:
            lowest[source], highest[source] = min(targets), max(targets)
    starts = np.array([element.start for element in elements], dtype=np.int64)
    lengths = np.array([element.end for element in elements], dtype=np.int64) - starts
    first = np.full(len(elements), none_aligned, dtype=np.int64)
    last = np.full(len(elements), -1, dtype=np.int64)
    levels = np.zeros(len(elements), dtype=np.int64)
    spans = lengths > 0
    levels[spans] = np.floor(np.log2(lengths[spans])).astype(np.int64)
    table_low, table_high = lowest, highest  # level k: extremes over words [i, i + 2**k)
    for level in range(int(levels[spans].max()) + 1 if spans.any() else 0):
        if level:
            half = 1 << (level - 1)
            table_low = np.minimum(table_low[:-half], table_low[half:])
            table_high = np.maximum(table_high[:-half], table_high[half:])
        chosen = np.flatnonzero(spans & (levels == level))
        if chosen.size:
            left, right = starts[chosen], starts[chosen] + lengths[chosen] - (1 << level)
            first[chosen] = np.minimum(table_low[left], table_low[right])
            last[chosen] = np.maximum(table_high[left], table_high[right])
    return [(low, high) if high >= 0 else None for low, high in zip(first.tolist(), last.tolist(), strict=True)]


def _target_range(extremes: tuple[int, int] | None, bounds: tuple[int, int], anchor: int) -> tuple[int, int]:
    """The target words from the first to the last aligned to an element's source words,
    clipped to `bounds`; when none (or clipped away), the empty range at `anchor` (clipped too)."""
    low, high = bounds
    if extremes is not None:
        first, last = max(extremes[0], low), min(extremes[1] + 1, high)
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


def _place(root: Element, links: dict[int, list[int]], num_src: int, num_tgt: int) -> list[_Placed]:
    """The target ranges of every node under `root`, parents before children (a work list,
    not recursion: any depth)."""
    elements = _elements(root)
    extremes = dict(zip(map(id, elements), _aligned_extremes(elements, links, num_src), strict=True))
    top: list[_Placed] = []
    pending: list[tuple[Element, tuple[int, int], list[_Placed]]] = [(root, (0, num_tgt), top)]
    while pending:
        element, bounds, placed = pending.pop()
        spans = []
        for order, child in enumerate(element.children):
            if isinstance(child, Point):
                position = min(max(_anchor(child.position, links, num_src, num_tgt), bounds[0]), bounds[1])
                placed.append(_Placed(child, position, position))
                continue
            anchor = _anchor(child.start, links, num_src, num_tgt)
            start, end = _target_range(extremes[id(child)], bounds, anchor)
            spans.append((start, order, end, child))
        # Siblings may not overlap. In the order their words land in the target (translation may
        # swap them), each starts where the previous one ended; one left with no word is empty.
        cursor = bounds[0]
        spans.sort()  # by start, then source order (unique: the rest is never compared)
        for start, _, end, child in spans:
            start = max(start, cursor)
            end = max(end, start)
            node = _Placed(child, start, end)
            placed.append(node)
            if child.children:
                pending.append((child, (start, end), node.children))
            cursor = max(cursor, end)
    return top


@dataclass(slots=True)
class _Frame:
    """An element being written: its placed children in output order, the next of them, the
    next target word, where its words end, and whether a space is due before the next piece."""

    ordered: list[_Placed]
    end: int
    position: int
    close_tag: str = ""
    cdata: bool = False
    index: int = 0
    space_due: bool = False


def _ordered(placed: list[_Placed]) -> list[_Placed]:
    # Empty nodes at a position come before the node that starts there.
    return sorted(placed, key=lambda p: (p.start, p.end > p.start)) if len(placed) > 1 else placed


def _render(placed: list[_Placed], words: Sequence[str]) -> str:
    """The output: words and tags, word-bearing pieces separated by spaces, an empty tag glued
    to what follows it. One output list and a stack of open elements, not recursion."""
    out: list[str] = []
    frames = [_Frame(_ordered(placed), len(words), 0)]

    def piece(frame: _Frame, text: str, word_bearing: bool) -> None:
        if frame.space_due:
            out.append(" ")
        out.append(text)
        frame.space_due = word_bearing

    while frames:
        frame = frames[-1]
        if frame.index < len(frame.ordered) and frame.ordered[frame.index].start <= frame.position:
            node = frame.ordered[frame.index]
            frame.index += 1
            if isinstance(node.node, Point):
                piece(frame, node.node.text, False)
                continue
            # The element is one piece of its parent: a space before it if due, and one after
            # it once it is closed if it holds a word.
            element = node.node
            piece(frame, element.open_tag, node.end > node.start)
            frame.position = max(frame.position, node.end)
            if node.children:
                frames.append(_Frame(_ordered(node.children), node.end, node.start, element.close_tag, element.cdata))
            else:  # a leaf (most elements): its words and its end tag at once
                escape = _cdata_escape if element.cdata else _escape
                out.append(" ".join(escape(word) for word in words[node.start : node.end]))
                out.append(element.close_tag)
            continue
        if frame.position < frame.end:
            word = words[frame.position]
            piece(frame, _cdata_escape(word) if frame.cdata else _escape(word), True)
            frame.position += 1
            continue
        out.append(frame.close_tag)
        frames.pop()
    return "".join(out)


def restore_markup(markup: Markup, translation: str, links: Sequence[tuple[int, int]]) -> str:
    """The translation (plain text) with the source's tags put back by word `links`
    ((source word, target word) pairs, as `decode.alignment=word` gives them)."""
    words = translation.split()
    aligned: dict[int, list[int]] = {}
    for i, j in links:
        if 0 <= j < len(words):
            aligned.setdefault(i, []).append(j)
    num_src = len(markup.text.split())
    with _no_cycle_collection():
        return _render(_place(markup.root, aligned, num_src, len(words)), words)


def strip_markup(line: str, fmt: str) -> str:
    """The plain text of a line of markup (what scores compare)."""
    return parse_markup(line, fmt).text
