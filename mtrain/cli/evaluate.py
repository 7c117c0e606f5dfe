"""`mtrain eval`: score a run (decode + sacreBLEU), a hypothesis file, or compare runs.

    mtrain eval run=RUN split=test [average_last=5]     decode, score, write RUN/eval/test.*
    mtrain eval hyp=out.en ref=test.en                   score a file (ref=[a,b]: several)
    mtrain eval runs=SWEEP_DIR [baseline=NAME]           compare runs, paired bootstrap
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any, Dict, List

from omegaconf import DictConfig

from mtrain.cli.common import mtrain_app
from mtrain.errors import MtrainError

log = logging.getLogger("mtrain")


def run_eval(cfg: DictConfig) -> Dict[str, Any]:
    """Dispatch to one of the three modes; returns what was computed (for tests and scripts)."""
    from mtrain.evaluate.metrics import check_metric_names

    check_metric_names(cfg.metrics)
    if cfg.runs:
        if cfg.run or cfg.hyp:
            raise MtrainError("runs=... compares runs; do not combine it with run= or hyp=")
        return compare(cfg)
    if cfg.hyp:
        from mtrain.evaluate.report import score_hypotheses

        return score_hypotheses(cfg, log=print)
    if cfg.run:
        from mtrain.evaluate.report import evaluate_run
        from mtrain.export.engine import convert_loaded

        return evaluate_run(cfg, log=print, convert=convert_loaded)
    raise MtrainError("nothing to evaluate: give run=RUN_DIR, hyp=FILE ref=FILE, or runs=SWEEP_DIR")


def compare(cfg: DictConfig) -> Dict[str, Any]:
    """`runs=`: the comparison table, with paired bootstrap on the runs' saved hypotheses."""
    from mtrain.evaluate.compare import compare_runs, comparison_notes
    from mtrain.evaluate.references import read_reference_files
    from mtrain.evaluate.runs import discover_runs

    runs = discover_runs(cfg.runs)
    refs = read_reference_files(list(cfg.ref)).references if cfg.ref else None
    comparison = compare_runs(runs, refs, cfg.baseline, cfg.split, list(cfg.metrics), cfg.bootstrap_samples,
                              cfg.tokenize, cfg.lowercase, cfg.chrf_word_order)
    print(comparison.table().to_text())
    for note in comparison_notes(comparison):
        print(note)
    return {"comparison": comparison}


def hydra_quote(value: str) -> str:
    """A value quoted for a Hydra override, so commas, spaces and brackets stay literal."""
    # Hydra reads a backslash as an escape only before a quote (or the closing quote).
    escaped = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    escaped = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, escaped)
    return f"'{escaped}'"


def friendly_overrides(argv: List[str], list_keys=("ref",), string_keys=("runs", "run", "hyp")) -> List[str]:
    """Accept `ref=FILE`, `ref=A,B` and `runs=A,B` as users type them.

    Hydra would reject a plain string for a list key and read `A,B` as a sweep; list keys
    become `[A,B]` and string keys are quoted.
    """
    out = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if sep and key in list_keys and value and not value.startswith("["):
            arg = f"{key}=[" + ",".join(hydra_quote(part) for part in value.split(",")) + "]"
        elif sep and key in string_keys and "," in value and value[0] not in "'\"":
            arg = f"{key}={hydra_quote(value)}"
        out.append(arg)
    return out


@mtrain_app("eval")
def _app(cfg: DictConfig) -> None:
    run_eval(cfg)


def main() -> None:
    sys.argv = sys.argv[:1] + friendly_overrides(sys.argv[1:])
    _app()


if __name__ == "__main__":
    main()
