"""Sentence-level utilities of MBR decoding: an N x M matrix of scores in one call.

`utility_matrix(hypotheses, references, name)` scores every hypothesis against every
pseudo-reference with sacreBLEU's sentence metrics, without a Python loop over the pairs:

- chrF: `fastchrf.pairwise_chrf` (Rust), with sacreBLEU's `CHRF()` settings: character
  6-grams, no word n-grams, beta 2, whitespace removed, no eps smoothing. Its scores equal
  `sacrebleu.sentence_chrf` (tests/test_mbr.py checks random pairs, empty strings included).
- BLEU: `sacrebleu.sentence_bleu`'s statistics (13a tokenization, n-grams 1-4, exp
  smoothing, effective order) counted once per distinct sentence into an n-gram count
  matrix per order; the clipped matches of all pairs are one `np.minimum(...).sum()` over
  it, and the score formula (sacrebleu's `BLEU.compute_bleu`) runs on whole arrays.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from mtrain.config import MbrUtility
from mtrain.errors import MtrainError

MAX_NGRAM_ORDER = 4  # sacreBLEU's BLEU
CHRF_CHAR_ORDER = 6  # sacreBLEU's CHRF(): chrF2 on character 6-grams, no word n-grams
CHRF_BETA = 2.0


def utility_matrix(hypotheses: Sequence[str], references: Sequence[str], utility: MbrUtility | str) -> np.ndarray:
    """(len(hypotheses), len(references)) float64: sacreBLEU's sentence score (0-100) of
    each hypothesis against each reference alone."""
    if MbrUtility(utility) == MbrUtility.chrf:
        return chrf_matrix(hypotheses, references)
    return bleu_matrix(hypotheses, references)


def chrf_matrix(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """sacreBLEU's sentence chrF of every (hypothesis, reference) pair, by fastchrf."""
    try:
        import fastchrf
    except ImportError as error:  # an optional dependency: pip install "mtrain[mbr]"
        raise MtrainError(
            'decode.mbr.utility=chrf needs the fastchrf package: pip install "mtrain[mbr]" (or use decode.mbr.utility=bleu)'
        ) from error
    if not hypotheses or not references:
        return np.zeros((len(hypotheses), len(references)))
    scores = fastchrf.pairwise_chrf(
        [list(hypotheses)],
        [list(references)],
        char_order=CHRF_CHAR_ORDER,
        beta=CHRF_BETA,
        remove_whitespace=True,
        eps_smoothing=False,
    )[0]
    return np.asarray(scores, dtype=np.float64)


def bleu_matrix(hypotheses: Sequence[str], references: Sequence[str]) -> np.ndarray:
    """sacreBLEU's sentence BLEU (`sacrebleu.sentence_bleu`: 13a, exp smoothing, effective
    order) of every (hypothesis, reference) pair."""
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    tokenize = Tokenizer13a()  # type: ignore[no-untyped-call]  # (sacrebleu: no annotations)
    texts = list(dict.fromkeys([*hypotheses, *references]))  # each distinct sentence counted once
    row = {text: i for i, text in enumerate(texts)}
    counts, lengths = _ngram_counts([tokenize(text.rstrip()).split() for text in texts])
    hyp_rows = np.array([row[text] for text in hypotheses], dtype=np.int64)
    ref_rows = np.array([row[text] for text in references], dtype=np.int64)
    hyp_len = lengths[hyp_rows].astype(np.float64)[:, None]  # (N, 1)
    ref_len = lengths[ref_rows].astype(np.float64)[None, :]  # (1, M)
    shape = (len(hyp_rows), len(ref_rows))

    # Matches and totals per order: (N, M) and (N, 1); a hypothesis has len - n + 1 n-grams.
    correct = [np.minimum(c[hyp_rows][:, None, :], c[ref_rows][None, :, :]).sum(axis=-1) for c in counts]
    total = [np.maximum(hyp_len - n, 0.0) for n in range(MAX_NGRAM_ORDER)]

    # compute_bleu, one pair per element: orders stop at the first with no hypothesis n-gram
    # (effective order); an order without a match counts 100 / (2^k * total), k = such orders so far.
    log_sum = np.zeros(shape)
    order = np.zeros(shape)
    smooth = np.ones(shape)
    active = np.ones(shape, dtype=bool)
    for n in range(MAX_NGRAM_ORDER):
        active &= np.broadcast_to(total[n] > 0, shape)
        matched = correct[n] > 0
        smooth = np.where(active & ~matched, smooth * 2.0, smooth)
        with np.errstate(divide="ignore", invalid="ignore"):
            precision = np.where(matched, 100.0 * correct[n] / total[n], 100.0 / (smooth * total[n]))
            log_sum += np.where(active, np.log(precision), 0.0)
        order += active
    # A hypothesis without any n-gram keeps order 4 and precisions 0 in sacreBLEU: score 0 (as below).
    with np.errstate(divide="ignore", invalid="ignore"):
        brevity = np.where(hyp_len >= ref_len, 1.0, np.exp(1.0 - ref_len / hyp_len))
        score = brevity * np.exp(log_sum / np.maximum(order, 1.0))
    any_match = sum(correct) > 0
    return np.where(any_match & (hyp_len > 0), score, 0.0)


def _ngram_counts(token_lists: Sequence[Sequence[str]]) -> tuple[list[np.ndarray], np.ndarray]:
    """Per order n (1-4), a (sentences, distinct n-grams of that order) count matrix; and
    the sentences' lengths in tokens."""
    counters: list[list[Counter[tuple[str, ...]]]] = [[] for _ in range(MAX_NGRAM_ORDER)]
    for tokens in token_lists:
        for n in range(1, MAX_NGRAM_ORDER + 1):
            counters[n - 1].append(Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)))
    matrices = []
    for per_sentence in counters:
        index: dict[tuple[str, ...], int] = {}
        for counter in per_sentence:
            for ngram in counter:
                index.setdefault(ngram, len(index))
        matrix = np.zeros((len(per_sentence), max(1, len(index))), dtype=np.int32)
        for i, counter in enumerate(per_sentence):
            for ngram, count in counter.items():
                matrix[i, index[ngram]] = count
        matrices.append(matrix)
    return matrices, np.array([len(tokens) for tokens in token_lists], dtype=np.int64)
