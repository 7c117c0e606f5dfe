"""Which cheap signal says how good a translation is: correlations with sentence chrF, and costs.

    python scripts/measure_confidence.py RUN [--reverse REVERSE_RUN] [--beam 5] [--nbest 5] [--limit N]
        [--write-calibration] [--json OUT.json]

Decodes the run's validation split (`valid`) and test split with beam search and its n-best,
computes per sentence the signals below and sacreBLEU's sentence chrF of the best hypothesis
against the reference, and prints per signal its Pearson and Spearman correlation with
sentence chrF on the test split and what it costs beyond the plain decode (seconds per 1,000
sentences, measured here). The combinations are fitted on the validation split (z-scores
from it; the linear one by least squares on it), never on the test split.

- `logprob`: the best hypothesis's mean token log-probability, log p(y|x) / (len(y) + 1);
  `exp_logprob`: its exp (the uncalibrated fallback of mtrain.decode.translation.confidence);
- `nbest_share`: the best's share of the n-best's probability mass (softmax of the log-probs);
- `agreement`: the mean chrF (fastchrf) of the best against the other n-best candidates,
  MBR's expected utility with the n-best as pseudo-references;
- `reverse`: a reverse run's log p(x|y) per source token, teacher-forced (--reverse);
- `calibrated logprob`: `logprob` through mtrain.decode.translation.confidence's isotonic calibration;
- `logprob+agreement`, `logprob+reverse`, `all (z-mean)`: the mean of z-scores;
  `all (linear)`: least squares of sentence chrF on every signal.

It also fits the calibration of mtrain.decode.translation.confidence on the validation split twice, on
the beam decode and on a greedy one (what `mtrain fit`'s last validation decodes), and says
how far each one's estimates lie from the test split's sentence chrF / 100 (mean absolute
error), so that reusing the validation's greedy decode can be judged. --write-calibration
writes the beam one into RUN/confidence.json (the way to (re)calibrate an existing run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from mtrain.decode.translation.confidence import (
    fit_calibration,
    mean_log_prob,
    write_calibration,
)
from mtrain.evaluate.calibration import sentence_chrf
from mtrain.rundir import CONFIDENCE_FILE


def say(line: str) -> None:
    print(f"measure_confidence: {line}", file=sys.stderr, flush=True)


@dataclass
class Candidate:
    text: str
    log_prob: float  # EOS included
    tokens: int  # output tokens, EOS excluded


@dataclass
class Decoder:
    """What this script needs from a run: n-best lists, a reverse score, the splits' text."""

    nbest: Callable[[list[str], int, int], list[list[Candidate]]]  # sources, beam, nbest
    reverse: Callable[[list[str], list[str]], list[float]] | None  # sources, hypotheses -> log p(x|y)/(|x|+1)
    split: Callable[[str], tuple[list[str], list[str]]]  # valid|test -> sources, references


def open_decoder(run: str, reverse_run: str | None, threads: int) -> Decoder:
    """The script's whole use of mtrain's decode API (the one place to change when decode/ moves)."""
    import torch
    from omegaconf import OmegaConf

    from mtrain.checkpoint.files import load_run
    from mtrain.config import DecodeConfig, to_typed, with_values
    from mtrain.decode import translate_sentences
    from mtrain.decode.engines.threads import set_decode_threads
    from mtrain.decode.selection.rerank import sequence_log_probs
    from mtrain.evaluate.references import read_run_split
    from mtrain.rundir import RunDir

    set_decode_threads(threads)
    loaded = load_run(run, which="best", device="cpu")
    # the run's decode settings, as typed as translate's (the stored config is plain)
    base = to_typed(OmegaConf.merge(OmegaConf.structured(DecodeConfig), loaded.config.get("decode", {})))
    reverse = load_run(reverse_run, which="best", device="cpu") if reverse_run else None

    def nbest(sources: list[str], beam: int, count: int) -> list[list[Candidate]]:
        cfg = with_values(base, beam=beam, nbest=count)
        with torch.inference_mode():
            decoded = translate_sentences(loaded.model, loaded.tokenizer, sources, cfg, "cpu")
        return [[Candidate(h.text, float(h.log_prob), len(h.tokens)) for h in hyps] for hyps in decoded]

    def reverse_scores(sources: list[str], hypotheses: list[str]) -> list[float]:
        assert reverse is not None
        tok = reverse.tokenizer
        # by text, so the two runs need not share a tokenizer: the hypothesis is its source
        rev_sources = [tok.encode_src(h) + [tok.eos_id] for h in hypotheses]
        rev_targets = [tok.encode_tgt(s) for s in sources]
        log_probs = sequence_log_probs(reverse.model, rev_sources, rev_targets, tok.pad_id, tok.bos_id, tok.eos_id)
        return [lp / (len(t) + 1) for lp, t in zip(log_probs, rev_targets, strict=True)]

    def split(name: str) -> tuple[list[str], list[str]]:
        text = read_run_split(RunDir(run), loaded.config.data, name)
        return list(text.sources), list(text.references[0])

    return Decoder(nbest, reverse_scores if reverse is not None else None, split)


def agreement(nbest: Sequence[Sequence[Candidate]]) -> np.ndarray:
    """Mean chrF / 100 of each best hypothesis against the other candidates (1 when there is none)."""
    import fastchrf

    out = []
    for candidates in nbest:
        others = [c.text for c in candidates[1:]]
        if not others:
            out.append(1.0)
            continue
        scores = fastchrf.pairwise_chrf(
            [[candidates[0].text]], [others], char_order=6, beta=2.0, remove_whitespace=True, eps_smoothing=False
        )[0][0]
        out.append(float(np.mean(scores)) / 100.0)
    return np.array(out)


def nbest_share(nbest: Sequence[Sequence[Candidate]]) -> np.ndarray:
    """The best candidate's share of the n-best's probability mass."""
    shares = []
    for candidates in nbest:
        log_probs = np.array([c.log_prob for c in candidates])
        log_probs = log_probs - log_probs.max()
        shares.append(float(np.exp(log_probs[0]) / np.exp(log_probs).sum()))
    return np.array(shares)


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their mean rank (Spearman's)."""
    order = np.argsort(values, kind="stable")
    sorted_values = values[order]
    result = np.empty(len(values))
    start = 0
    while start < len(values):
        end = start
        while end + 1 < len(values) and sorted_values[end + 1] == sorted_values[start]:
            end += 1
        result[order[start : end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return result


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(a, b)[0, 1])


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return pearson(ranks(a), ranks(b))


@dataclass
class Split:
    sources: list[str]
    references: list[str]
    nbest: list[list[Candidate]]
    chrf: np.ndarray
    signals: dict[str, np.ndarray]
    seconds: dict[str, float]  # per signal's extra cost, for the whole split


def measure_split(decoder: Decoder, name: str, beam: int, count: int, limit: int) -> Split:
    sources, references = decoder.split(name)
    if limit:
        sources, references = sources[:limit], references[:limit]
    say(f"{name}: {len(sources)} sentences, beam {beam} (best only)")
    start = time.perf_counter()
    decoder.nbest(sources, beam, 1)
    plain = time.perf_counter() - start
    say(f"{name}: beam {beam}, n-best {count}")
    start = time.perf_counter()
    nbest = decoder.nbest(sources, beam, count)
    with_nbest = time.perf_counter() - start
    best = [c[0] for c in nbest]
    hypotheses = [b.text for b in best]
    chrf = np.array(sentence_chrf(hypotheses, references))
    logprob = np.array([mean_log_prob(b.log_prob, b.tokens) for b in best])
    seconds = {"decode (beam, best only)": plain, "logprob": 0.0, "exp_logprob": 0.0}
    signals = {"logprob": logprob, "exp_logprob": np.exp(logprob)}
    start = time.perf_counter()
    signals["nbest_share"] = nbest_share(nbest)
    seconds["nbest_share"] = max(with_nbest - plain, 0.0) + time.perf_counter() - start
    start = time.perf_counter()
    signals["agreement"] = agreement(nbest)
    seconds["agreement"] = max(with_nbest - plain, 0.0) + time.perf_counter() - start
    if decoder.reverse is not None:
        say(f"{name}: the reverse run's scores")
        start = time.perf_counter()
        signals["reverse"] = np.array(decoder.reverse(sources, hypotheses))
        seconds["reverse"] = time.perf_counter() - start
    return Split(sources, references, nbest, chrf, signals, seconds)


def add_combinations(valid: Split, test: Split) -> None:
    """Combinations, their z-scores and weights from the validation split."""

    def z(split: Split, name: str) -> np.ndarray:
        base = valid.signals[name]
        return (split.signals[name] - base.mean()) / max(base.std(), 1e-12)

    groups = {"logprob+agreement": ["logprob", "agreement"], "logprob+reverse": ["logprob", "reverse"]}
    basic = [n for n in ("logprob", "nbest_share", "agreement", "reverse") if n in valid.signals]
    groups["all (z-mean)"] = basic
    for name, members in groups.items():
        if all(m in valid.signals for m in members):
            for split in (valid, test):
                split.signals[name] = np.mean([z(split, m) for m in members], axis=0)
                split.seconds[name] = sum(split.seconds[m] for m in members)
    calibration = fit_calibration(valid.signals["logprob"], valid.chrf / 100)  # what fit writes, on beam
    for split in (valid, test):
        split.signals["calibrated logprob"] = np.array([calibration(x) for x in split.signals["logprob"]])
        split.seconds["calibrated logprob"] = 0.0
    design = np.column_stack([np.ones(len(valid.chrf)), *[valid.signals[n] for n in basic]])
    weights, *_ = np.linalg.lstsq(design, valid.chrf, rcond=None)
    for split in (valid, test):
        split.signals["all (linear)"] = (
            np.column_stack([np.ones(len(split.chrf)), *[split.signals[n] for n in basic]]) @ weights
        )
        split.seconds["all (linear)"] = sum(split.seconds[n] for n in basic)


def per_thousand(seconds: float, sentences: int) -> float:
    return 1000.0 * seconds / max(sentences, 1)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run")
    parser.add_argument("--reverse", help="a run of the opposite direction (its log p(source | translation))")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--nbest", type=int, default=5)
    parser.add_argument("--limit", type=int, default=0, help="the first N sentences of each split (0: all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--write-calibration", action="store_true", help=f"write RUN/{CONFIDENCE_FILE}")
    parser.add_argument("--json", type=Path, help="also write the table and the per-sentence values here")
    args = parser.parse_args(argv)

    decoder = open_decoder(args.run, args.reverse, args.threads)
    valid = measure_split(decoder, "valid", args.beam, args.nbest, args.limit)
    test = measure_split(decoder, "test", args.beam, args.nbest, args.limit)
    add_combinations(valid, test)

    rows = []
    print("| signal | Pearson | Spearman | extra s / 1000 sentences |")
    print("|---|---|---|---|")
    for name, values in test.signals.items():
        row = {
            "signal": name,
            "pearson": pearson(values, test.chrf),
            "spearman": spearman(values, test.chrf),
            "extra_s_per_1000": per_thousand(test.seconds[name], len(test.chrf)),
        }
        rows.append(row)
        print(f"| {name} | {row['pearson']:.3f} | {row['spearman']:.3f} | {row['extra_s_per_1000']:.1f} |")
    decode_cost = per_thousand(test.seconds["decode (beam, best only)"], len(test.chrf))
    print(
        f"test: {len(test.chrf)} sentences, mean sentence chrF {test.chrf.mean():.2f}; "
        f"the plain beam-{args.beam} decode took {decode_cost:.1f} s / 1000 sentences"
    )

    # The calibration, fitted on valid's beam decode and on a greedy one (fit's last validation)
    say("valid: greedy, for the calibration fit's last validation would make")
    greedy = decoder.nbest(valid.sources, 1, 1)
    greedy_signal = [mean_log_prob(c[0].log_prob, c[0].tokens) for c in greedy]
    greedy_chrf = np.array(sentence_chrf([c[0].text for c in greedy], valid.references))
    fits = {
        f"valid, beam {args.beam}": fit_calibration(
            valid.signals["logprob"],
            valid.chrf / 100,
            fitted_on=f"valid, {len(valid.chrf)} sentences, beam {args.beam}",
        ),
        "valid, greedy": fit_calibration(
            greedy_signal, greedy_chrf / 100, fitted_on=f"valid, {len(valid.chrf)} sentences, beam 1"
        ),
    }
    truth = test.chrf / 100
    calibration_rows = {}
    for name, calibration in fits.items():
        estimates = np.array([calibration(s) for s in test.signals["logprob"]])
        mae = float(np.abs(estimates - truth).mean())
        calibration_rows[name] = {"mae": mae, "mean_estimate": float(estimates.mean()), "knots": len(calibration.knots)}
        print(
            f"calibration fitted on {name}: test MAE {mae:.3f} (mean estimate {estimates.mean():.3f}, "
            f"mean chrF/100 {truth.mean():.3f}, {len(calibration.knots)} knots)"
        )
    uncalibrated = np.exp(test.signals["logprob"])
    print(f"uncalibrated exp(logprob): test MAE {float(np.abs(uncalibrated - truth).mean()):.3f}")
    if args.write_calibration:
        path = Path(args.run) / CONFIDENCE_FILE
        write_calibration(path, fits[f"valid, beam {args.beam}"])
        say(f"wrote {path}")
    if args.json is not None:
        record = {
            "run": args.run,
            "reverse": args.reverse,
            "beam": args.beam,
            "nbest": args.nbest,
            "test_sentences": len(test.chrf),
            "decode_s_per_1000": decode_cost,
            "table": rows,
            "calibration": calibration_rows,
            "test": {"chrf": test.chrf.tolist(), **{k: v.tolist() for k, v in test.signals.items()}},
            "valid": {"chrf": valid.chrf.tolist(), **{k: v.tolist() for k, v in valid.signals.items()}},
        }
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
