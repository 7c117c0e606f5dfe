"""The one evaluation path: translate a split's sources, score them against its references.

`mtrain fit` (validation BLEU during training, the test split at the end) and `mtrain eval`
all call `translate_and_score`; only what they do with the result differs. `score_split`
scores a run's split and writes its report (mtrain.evaluate.report); `sentence_translator`
turns a model into the `Translate` both take. A `Translate` returns plain strings or, as
`sentence_translator`'s does, the best `Hypothesis` per source: then its score (the
length-normalised log-probability) travels with the text to the per-sentence scores.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

from mtrain.config import DataConfig, DecodeConfig, Precision
from mtrain.errors import MtrainError
from mtrain.evaluate.metrics import check_lengths, score_corpus
from mtrain.evaluate.references import SplitText
from mtrain.evaluate.report import save_split_report, split_report
from mtrain.evaluate.scored import Scored
from mtrain.evaluate.sentences import per_sentence_record, score_sentences, sentences_path
from mtrain.rundir import RunDir

if TYPE_CHECKING:
    import torch

    from mtrain.decode.search.hypothesis import Hypothesis
    from mtrain.evaluate.terminology import GlossaryFile
    from mtrain.tokenizer import Tokenizer

# Sources in, one hypothesis per source out (any engine: torch, CTranslate2, ...): its text, or
# the Hypothesis (text and model score).
Translate = Callable[[list[str]], Sequence[Union[str, "Hypothesis"]]]


def check_references(references: Sequence[Sequence[str]], name: str) -> None:
    """Refuse reference streams that are empty or blank throughout: every score would be 0."""
    for stream in references:
        if not any(line.strip() for line in stream):
            raise MtrainError(
                f"{name}: the references are {'empty' if not stream else 'blank on every line'}; "
                "a score against them means nothing. Check the split's files (or ref=)"
            )


def translate_and_score(
    translate: Translate,
    sources: Sequence[str],
    references: Sequence[Sequence[str]],
    name: str,
    metrics: Sequence[str] = ("bleu",),
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
) -> Scored:
    """Translate `sources` and score the hypotheses with sacreBLEU against each reference stream.

    `name` says what is scored in error messages (e.g. "data.splits.test=test_2016_flickr").
    """
    check_references(references, name)
    check_lengths(len(sources), [len(stream) for stream in references], f"{name} sources")
    start = time.perf_counter()
    outputs = list(translate(list(sources)))
    seconds = time.perf_counter() - start
    hypotheses = [output if isinstance(output, str) else output.text for output in outputs]
    model_scores = None
    if outputs and not any(isinstance(output, str) for output in outputs):
        model_scores = [
            float(output.score) if source.strip() and not isinstance(output, str) else None
            for source, output in zip(sources, outputs, strict=True)
        ]
    expected = [getattr(output, "expected_utility", None) for output in outputs]
    scores = score_corpus(hypotheses, references, metrics, tokenize, lowercase, chrf_word_order)
    return Scored(hypotheses, scores, seconds, model_scores, expected if any(v is not None for v in expected) else None)


def sentence_translator(
    model: Any,
    tokenizer: Tokenizer,
    decode_cfg: DecodeConfig,
    device: torch.device,
    precision: Precision | str,
    on_batch: Callable[[int], None] | None = None,
) -> Translate:
    """The best hypothesis per source sentence (with `.text` and `.score`), decoded with
    `decode_cfg` (a `Translate`); `on_batch(num_sentences)` after each batch (progress).

    `model`: mtrain's model or any decoding engine (mtrain.decode.translation.translator.Engine)."""
    import torch

    from mtrain.decode import Hypothesis, translate_sentences

    def translate(sources: list[str]) -> list[Hypothesis]:
        with torch.inference_mode():
            nbest = translate_sentences(model, tokenizer, sources, decode_cfg, device, precision, on_batch)
        return [candidates[0] if candidates else Hypothesis(tokens=[], score=float("nan")) for candidates in nbest]

    return translate


def score_split(
    run: RunDir,
    split_key: str,
    data_cfg: DataConfig,
    split: SplitText,
    translate: Translate,
    checkpoint_info: dict[str, Any],
    decode_info: dict[str, Any],
    metrics: Sequence[str],
    tokenize: str = "13a",
    lowercase: bool = False,
    chrf_word_order: int = 0,
    log: Callable[[str], None] = print,
    out_dir: Path | None = None,
    per_sentence: bool = False,
    worst_lines: int = 10,
    report_name: str | None = None,
    glossary: GlossaryFile | None = None,
) -> dict[str, Any]:
    """Translate and score one split of a run, write `eval/<split>.{hyp,json,md}` (or the same
    files in `out_dir`); the report. `per_sentence` also writes `<split>.sentences.tsv` there
    (mtrain.evaluate.sentences), and the report lists its `worst_lines`. `report_name`
    replaces `<split>` in those names (a multilingual run's direction: `test.de-en`); the
    report's language pair is `data_cfg`'s (src/tgt: the direction decoded). With `glossary`,
    the report's `terms` holds its terminology metrics against the first reference stream
    (mtrain.evaluate.terminology).

    `mtrain eval run=...` and the test scoring at the end of `mtrain fit` both come here.
    """
    name = f"data.splits.{split_key}={getattr(data_cfg.splits, split_key)}"
    scored = translate_and_score(
        translate, split.sources, split.references, name, metrics, tokenize, lowercase, chrf_word_order
    )
    report = split_report(
        run, split_key, data_cfg, split, scored, checkpoint_info, decode_info, tokenize, lowercase, chrf_word_order
    )
    if glossary is not None:
        report["terms"] = glossary.record(split.sources, scored.hypotheses, split.references[0])
    name = report_name or split_key
    sentences = None
    if per_sentence:
        sentences = score_sentences(
            scored.hypotheses,
            split.references,
            split.sources,
            scored.model_scores,
            tokenize,
            lowercase,
            chrf_word_order,
            scored.expected_utilities,
        )
        tsv = sentences_path(Path(out_dir) if out_dir is not None else run.eval_dir, name)
        report["per_sentence"] = per_sentence_record(tsv, sentences, worst_lines)
    save_split_report(run, report, scored.hypotheses, log, out_dir, sentences, name)
    return report
