"""What an Argos package scores: the BLEU of its own decoding on the run's test split.

Argos Translate decodes with its settings, not the run's: beam 4, length penalty 0.2, at most
256 output tokens (mtrain/export/argos.py), and CTranslate2's compute type `auto`
(`ARGOS_COMPUTE_TYPE`): the fastest type the machine supports, int8 on CPUs with int8 kernels
(AVX2, AVX512, AMX: `int8_float32`) whatever the package's weights. A small model's
translations change with int8 (30 of 30 lines of a 12-update Multi30k model on an Intel Xeon
with AMX), so the package is scored, and compared with Argos, at the type Argos gets here. `mtrain export format=argos` decodes the run's test
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
ARGOS_COMPUTE_TYPE = "auto"  # argostranslate.settings.compute_type's default (CTranslate2's name)


def argos_decoding(max_positions: int) -> DecodeConfig:
    """Argos's settings as mtrain's decode config (the output limit within the position table)."""
    limit = min(ARGOS_MAX_TOKENS, max_positions - 1)
    return DecodeConfig(beam=ARGOS_BEAM, length_penalty=ARGOS_LENGTH_PENALTY, max_len_a=0.0, max_len_b=limit)


def scoring_command(run_dir: Path, compute: str | None = None) -> str:
    """The command that scores the run's test split with Argos's settings (`compute`: the
    CTranslate2 compute type Argos gets on this machine, when known)."""
    precision = f" precision={compute}" if compute else ""
    return (
        f"mtrain eval run={run_dir} split=test engine=ctranslate2 decode.beam={ARGOS_BEAM} "
        f"decode.length_penalty={ARGOS_LENGTH_PENALTY} decode.max_len_a=0 decode.max_len_b={ARGOS_MAX_TOKENS}"
        f"{precision}"
    )


def package_score_line(model_dir: Path, run_dir: Path, direction: str, max_positions: int) -> str:
    """One line: the BLEU of Argos's settings with the CTranslate2 model in `model_dir` (an
    `mtrain export` directory) on the run's test split, and the run's own; or how to get it."""
    from mtrain.decode.engines.ct2_engine import load_ctranslate2
    from mtrain.decode.translation.translator import translate_sentences
    from mtrain.evaluate.metrics import read_lines, score_corpus

    split = _test_split(RunDir(run_dir), direction)
    if split is None:
        return (
            f"score: run={run_dir} keeps no test split (data/test.src, data/test.ref); the package decodes with "
            f"beam {ARGOS_BEAM} and length penalty {ARGOS_LENGTH_PENALTY}: score that with {scoring_command(run_dir)}"
        )
    sources, references = read_lines(split[0]), read_lines(split[1])
    engine = load_ctranslate2(model_dir, torch.device("cpu"), ct2_compute_type=ARGOS_COMPUTE_TYPE)
    settings = argos_decoding(max_positions)
    hypotheses = [hyps[0].text for hyps in translate_sentences(engine, engine.tokenizer, sources, settings, "cpu")]
    bleu = score_corpus(hypotheses, [references], ["bleu"])["bleu"]["score"]
    return (
        f"score: BLEU {bleu:.2f} on the run's test split ({len(sources):,} lines) with the package's decoding "
        f"(beam {ARGOS_BEAM}, length penalty {ARGOS_LENGTH_PENALTY}, {engine.translator.compute_type} compute "
        f"as CTranslate2's auto picks on this CPU, as Argos decodes){_own_score(RunDir(run_dir))}"
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
