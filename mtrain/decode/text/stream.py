"""`mtrain translate`'s job: a file or stdin in, one line per input line out.

Reads the input in chunks (so a stream is translated as it arrives and memory stays
bounded), turns each line into a request (its prefix line, its tab-separated constraints),
translates a chunk through the request pipeline (`mtrain.decode.requests.pipeline`: markup, terms,
controls; blank lines stay blank, over-long ones are truncated with a warning naming the
line), and writes plain hypotheses or n-best TSV rows (`nbest > 1`), each with its
confidence score in a column after the text when `confidence=true` (said once at the start:
the run's calibration, or uncalibrated). Optionally saves a cross-attention picture
per sentence. A progress bar goes to stderr when the output is a file (or a terminal),
never when the output is a pipe.

Interactive mode (`interactive=true`, or null with stdin a terminal) reads one line at a
time and writes and flushes its translation before reading the next, so a person typing
sees each answer at once; chunks of 10,000 lines would wait for input that never comes.
Pipes and files keep the chunks: sorting and batching a chunk by length is what makes a
file decode fast. With stdin and stderr both terminals a prompt goes to stderr.
"""

from __future__ import annotations

import logging
import os
import select
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TextIO

import torch
from tqdm import tqdm

from mtrain.config import TranslateConfig
from mtrain.data.bounded_lines import bounded_lines, check_line_length
from mtrain.decode.engines.engine import Engine
from mtrain.decode.requests.controls import LineControls
from mtrain.decode.requests.pipeline import (
    FieldNames,
    Options,
    PipelineStats,
    RequestPipeline,
    with_options,
)
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.decode.text.attention_plot import plot_attention
from mtrain.decode.text.textio import (
    InputRepairs,
    count_lines,
    decode_line,
    nbest_rows,
    open_input,
    output_line,
    read_chunks,
    write_output,
)
from mtrain.decode.translation.confidence import Confidence, run_confidence
from mtrain.errors import MtrainError
from mtrain.model.positions import position_limit
from mtrain.source_factors import TERM_TARGET, split_ids
from mtrain.tokenizer import Tokenizer

if TYPE_CHECKING:
    from mtrain.decode.engines.ensemble import EnsembleModel
    from mtrain.model import Seq2SeqTransformer

log = logging.getLogger("mtrain.translate")

CHUNK_LINES = 10_000  # lines sorted and batched together; output appears chunk by chunk
EOS_PIECE = "</s>"
PROMPT = "> "
POLL_S = 0.2  # how soon a Ctrl-C is acted on while waiting for a typed line
READ_BYTES = 1 << 16


@dataclass
class StreamReport:
    lines: int
    truncated_lines: int
    undecodable_bytes: int
    undecodable_lines: int
    controls: PipelineStats  # what constraints and terms did


def attention_layer_of(cfg: TranslateConfig) -> int | str | None:
    """The decoder layer(s) whose attention is drawn; None when no pictures are asked for."""
    if cfg.attention is None:
        return None
    layer = str(cfg.attention_layer)
    if layer in ("last", "all"):
        return layer
    try:
        return int(layer)
    except ValueError:
        raise MtrainError(f"attention_layer={layer!r}: choose last, all or a decoder layer index") from None


def show_progress(cfg: TranslateConfig) -> bool:
    """A bar for files and terminals; never into a pipe (it would mix with the output)."""
    writing_to_terminal = cfg.output is None and sys.stdout.isatty()
    return (cfg.output is not None or writing_to_terminal) and sys.stderr.isatty()


def is_interactive(cfg: TranslateConfig) -> bool:
    """Line by line: as `cfg.interactive` says, or (null) when the input is stdin and a terminal."""
    if cfg.interactive is not None:
        return cfg.interactive
    return cfg.input is None and sys.stdin is not None and sys.stdin.isatty()


def typed_lines(stream: BinaryIO, prompt: str | None, where: str, max_chars: int) -> Iterator[bytes]:
    """The stream's lines, each as soon as it is complete; with a `prompt`, that is written to
    stderr before each line is read, and a newline after the last (Ctrl-D), so the shell's
    prompt starts on a line of its own. A line longer than `max_chars` is refused (MtrainError
    naming `where` and the line) as soon as that much of it has arrived.

    Waits in select() with a timeout instead of blocking in read(): Ctrl-C is a SIGINT to the
    process, which the kernel may hand to any of its threads, and a main thread blocked in
    read() is then never woken, so the KeyboardInterrupt would wait for the next typed line.
    Returning to Python every POLL_S raises it within that time, whichever thread took it.
    """
    try:
        fd = stream.fileno()
    except (OSError, ValueError):  # an in-memory stream: nothing to wait for
        fd = None
    pending = b""
    number = 0
    while True:
        number += 1
        if prompt is not None:
            sys.stderr.write(prompt)
            sys.stderr.flush()
        while b"\n" not in pending:
            check_line_length(pending, where, number, max_chars)
            if fd is None:
                data = stream.readline(READ_BYTES)
            elif select.select([fd], [], [], POLL_S)[0]:
                data = os.read(fd, READ_BYTES)
            else:
                continue
            if not data:  # end of input (Ctrl-D at a terminal)
                if pending:
                    yield pending
                if prompt is not None:
                    sys.stderr.write("\n")
                    sys.stderr.flush()
                return
            pending += data
        line, _, pending = pending.partition(b"\n")
        check_line_length(line, where, number, max_chars)
        yield line + b"\n"


class PrefixLines:
    """`prefix=FILE`'s lines, read along with the input's; MtrainError when the counts differ."""

    def __init__(self, path: str, max_chars: int) -> None:
        self.path = path
        self.handle = Path(path).open("rb")
        self.lines = bounded_lines(self.handle, f"prefix={path}", max_chars)
        self.read = 0

    def take(self, count: int) -> list[str]:
        lines = []
        for _ in range(count):
            raw = next(self.lines, b"")
            if not raw:
                raise MtrainError(
                    f"prefix={self.path}: ends after line {self.read}, the input has more lines; "
                    "give one prefix line per input line (a blank line: no prefix)"
                )
            self.read += 1
            lines.append(decode_line(raw.rstrip(b"\n").rstrip(b"\r"))[0])
        return lines

    def finish(self) -> None:
        extra = next(self.lines, b"")
        self.handle.close()
        if extra:
            raise MtrainError(
                f"prefix={self.path}: line {self.read + 1} and on have no input line (the input has "
                f"{self.read}); give one prefix line per input line"
            )


def translate_stream(
    model: Seq2SeqTransformer | EnsembleModel | Engine,
    tokenizer: Tokenizer,
    cfg: TranslateConfig,
    device: torch.device,
    precision: str,
    line_controls: LineControls | None = None,
    ctranslate2: bool = False,
) -> StreamReport:
    """Translate `cfg.input` (stdin when null) into `cfg.output` (stdout when null) through the
    request pipeline (mtrain.decode.requests.pipeline). `line_controls`: how each line's constraints are
    found (`cfg.constraints`, `terms`, `avoid`; read by the caller before the model loads);
    `cfg.prefix` is read here. `ctranslate2`: the engine is CTranslate2's (what it cannot
    honour is refused, as the config checks refuse it)."""
    limit = cfg.max_input_tokens
    model_limit = position_limit(model)
    if model_limit is not None and model_limit < limit:
        limit = model_limit  # the encoder cannot embed more positions
    controlled = line_controls or LineControls()
    pipeline = RequestPipeline(model, tokenizer, device, precision, ctranslate2=ctranslate2, input_limit=limit)
    options = Options(
        with_options(cfg.decode),
        format=str(cfg.format),
        glossary=controlled.glossary,
        attention_layer=attention_layer_of(cfg),
        names=command_line_names(cfg),
        confidence=confidence_of(cfg),
    )
    input_name = cfg.input if cfg.input is not None else "stdin"
    attention_dir = Path(cfg.attention) if cfg.attention is not None else None
    nbest = cfg.decode.nbest > 1
    interactive = is_interactive(cfg)

    prefix_lines = PrefixLines(cfg.prefix, cfg.max_line_chars) if cfg.prefix is not None else None
    stats = InputRepairs()
    truncated = 0
    source = open_input(cfg.input)
    # Lines are read at most max_line_chars at a time: a 1 GB line or /dev/zero is refused, not held.
    where = f"input={cfg.input}" if cfg.input is not None else "stdin"
    lines: Iterable[bytes] = bounded_lines(source, where, cfg.max_line_chars)
    if interactive:
        log.info("interactive: each line is translated as it is read; Ctrl-D ends")
        at_terminal = cfg.input is None and sys.stdin.isatty() and sys.stderr.isatty()
        lines = typed_lines(source, PROMPT if at_terminal else None, where, cfg.max_line_chars)

    def translate_into(sink: TextIO) -> None:
        nonlocal truncated
        shown = not interactive and show_progress(cfg)  # (counting a file's lines reads it all: only for a bar)
        progress = tqdm(
            total=count_lines(cfg.input) if shown else None, unit=" lines", file=sys.stderr, disable=not shown
        )
        try:
            first_line = 1
            for chunk in read_chunks(lines, 1 if interactive else CHUNK_LINES, stats):
                prefixes = prefix_lines.take(len(chunk)) if prefix_lines is not None else [""] * len(chunk)
                requests = [
                    controlled.request(line, prefix, f"{input_name}:{first_line + offset}")
                    for offset, (line, prefix) in enumerate(zip(chunk, prefixes, strict=True))
                ]
                translation = pipeline.begin(requests, options)
                prepared = translation.requests
                progress.update(sum(not sentence.plain.strip() for sentence in prepared))
                hyps = translation.finish(
                    pipeline.decode(
                        prepared, options.decoding(), attention_layer=options.attention_layer, on_batch=progress.update
                    )
                )
                truncated += sum(sentence.cut for sentence in prepared)
                for offset, sentence_hyps in enumerate(hyps):
                    if nbest:
                        sink.write("\n".join(nbest_rows(first_line + offset - 1, sentence_hyps, cfg.confidence)) + "\n")
                    else:
                        sink.write(output_line(sentence_hyps[0], cfg.confidence) + "\n")
                sink.flush()
                if attention_dir is not None:
                    _draw(attention_dir, tokenizer, [p.ids for p in prepared], hyps, first_line, cfg.attention_layer)
                first_line += len(chunk)
            if prefix_lines is not None:
                prefix_lines.finish()
        finally:
            progress.close()
            if prefix_lines is not None:
                prefix_lines.handle.close()

    try:
        write_output(cfg.output, translate_into)
    finally:
        if cfg.input is not None:  # stdin stays open (and sys.stdin is None when the shell closed it)
            source.close()
    if stats.undecodable_bytes:
        log.warning(
            "%d bytes on %d lines were not UTF-8 (first on line %d); each became U+FFFD",
            stats.undecodable_bytes,
            stats.undecodable_lines,
            stats.first_undecodable_line,
        )
    return StreamReport(stats.lines, truncated, stats.undecodable_bytes, stats.undecodable_lines, pipeline.stats)


def confidence_of(cfg: TranslateConfig) -> Confidence | None:
    """The confidence scores `cfg.confidence` asks for (None: none), said in one line: run='s
    calibration (`confidence.json`), or uncalibrated where it has none (an older run, an
    export) or decodes with an ensemble, whose log-probabilities the calibration never saw."""
    if not cfg.confidence:
        return None
    confidence = run_confidence(cfg.run) if cfg.run is not None and not cfg.ensemble else Confidence()
    log.info("confidence scores: %s", confidence.source)
    return confidence


def command_line_names(cfg: TranslateConfig) -> FieldNames:
    """What translate's refusals name: its keys with their values (`terms=glossary.tsv`)."""
    return FieldNames(
        prefix=f"prefix={cfg.prefix}",
        constraints=f"constraints={cfg.constraints}",
        terms=f"terms={cfg.terms}",
        avoid=f"avoid={cfg.avoid}",
        format=f"format={cfg.format}",
        alignment=f"decode.alignment={cfg.decode.alignment}",
        pictures=f"attention={cfg.attention}",
    )


def _draw(
    directory: Path,
    tokenizer: Tokenizer,
    sources: list[list[int] | None],
    hyps: list[list[Hypothesis]],
    first_line: int,
    layer: int | str,
) -> None:
    """One PNG per translated line: `<line number>.png` (1-based, blank lines have none)."""
    for offset, (ids, sentence_hyps) in enumerate(zip(sources, hyps, strict=True)):
        best = sentence_hyps[0]
        if ids is None or best.attention is None:
            continue
        pieces, factors = split_ids(ids[:-1], tokenizer.src_vocab_size)  # a term-aware model's terms shown as +term
        src_pieces = [
            f"+{piece}" if factor == TERM_TARGET else piece
            for piece, factor in zip(tokenizer.src_pieces(pieces), factors, strict=True)
        ] + [EOS_PIECE]
        tgt_pieces = tokenizer.tgt_pieces(best.tokens) + [EOS_PIECE]
        weights = best.attention
        layer_names = [f"layer {i}" for i in range(weights.shape[1])] if weights.dim() == 3 else [f"layer {layer}"]
        line = first_line + offset
        plot_attention(
            weights,
            src_pieces,
            tgt_pieces,
            directory / f"{line:06d}.png",
            title=f"line {line}: {best.text}",
            layer_names=layer_names,
        )
