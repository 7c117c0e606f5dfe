"""What an Argos package scores: the BLEU of its own decoding on the run's test split.

Argos Translate decodes with its settings, not the run's: beam 4, length penalty 0.2, at most
256 output tokens (mtrain/export/argos.py). `mtrain export format=argos` decodes the run's test
split (the copy `mtrain fit` keeps in data/) with the package's CTranslate2 model and those
settings, and prints its BLEU beside the run's own score (eval/test.json): what a user of the
package gets, next to what the run reported. mtrain's decoding with these settings gives
Argos's lines but where Argos's own conventions decide a near-tie (docs/EXPORT.md counts them).
A run without that copy gets the command that scores it instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mtrain.config import DecodeConfig
from mtrain.rundir import RunDir

ARGOS_BEAM, ARGOS_LENGTH_PENALTY, ARGOS_MAX_TOKENS = 4, 0.2, 256


def argos_decoding(max_positions: int) -> DecodeConfig:
    """Argos's settings as mtrain's decode config (the output limit within the position table)."""
    limit = min(ARGOS_MAX_TOKENS, max_positions - 1)
    return DecodeConfig(beam=ARGOS_BEAM, length_penalty=ARGOS_LENGTH_PENALTY, max_len_a=0.0, max_len_b=limit)


def scoring_command(run_dir: Path) -> str:
    """The command that scores the run's test split with Argos's settings."""
    return (
        f"mtrain eval run={run_dir} split=test engine=ctranslate2 decode.beam={ARGOS_BEAM} "
        f"decode.length_penalty={ARGOS_LENGTH_PENALTY} decode.max_len_a=0 decode.max_len_b={ARGOS_MAX_TOKENS}"
    )


def package_score_line(model_dir: Path, run_dir: Path, direction: str, max_positions: int) -> str:
    """One line: the BLEU of Argos's settings with the CTranslate2 model in `model_dir` (an
    `mtrain export` directory) on the run's test split, and the run's own; or how to get it."""
    from mtrain.decode.ct2_engine import load_ctranslate2
    from mtrain.decode.translator import translate_sentences
    from mtrain.evaluate.metrics import read_lines, score_corpus

    split = _test_split(RunDir(run_dir), direction)
    if split is None:
        return (
            f"score: run={run_dir} keeps no test split (data/test.src, data/test.ref); the package decodes with "
            f"beam {ARGOS_BEAM} and length penalty {ARGOS_LENGTH_PENALTY}: score that with {scoring_command(run_dir)}"
        )
    sources, references = read_lines(split[0]), read_lines(split[1])
    engine = load_ctranslate2(model_dir, torch.device("cpu"))
    settings = argos_decoding(max_positions)
    hypotheses = [hyps[0].text for hyps in translate_sentences(engine, engine.tokenizer, sources, settings, "cpu")]
    bleu = score_corpus(hypotheses, [references], ["bleu"])["bleu"]["score"]
    return (
        f"score: BLEU {bleu:.2f} on the run's test split ({len(sources):,} lines) with the package's decoding "
        f"(beam {ARGOS_BEAM}, length penalty {ARGOS_LENGTH_PENALTY}, as Argos decodes){_own_score(RunDir(run_dir))}"
    )


def _test_split(run: RunDir, direction: str) -> tuple[Path, Path] | None:
    for files in (run.split_files("test"), run.split_files("test", direction)):
        if all(path.is_file() for path in files):
            return files
    return None


def _own_score(run: RunDir) -> str:
    """`; the run's own decoding (beam 5, length penalty 1.0): BLEU 35.71 (eval/test.json)`, or ""."""
    report_file = run.eval_file("test", "json")
    try:
        report = json.loads(report_file.read_text(encoding="utf-8"))
        decode, bleu = report.get("decode", {}), float(report["metrics"]["bleu"]["score"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return ""
    return (
        f"; the run's own decoding (beam {decode.get('beam')}, length penalty {decode.get('length_penalty')}): "
        f"BLEU {bleu:.2f} ({report_file.relative_to(run.path).as_posix()})"
    )
