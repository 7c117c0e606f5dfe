"""`mtrain report SWEEP_DIR [out=DIR] [baseline=RUN]`: a Markdown table and loss/BLEU plots of a sweep.

The sweep directory may be given as the first argument (`mtrain report multirun/...`) or as
`sweep=...`; comma-separated run directories work too (then `out=` is required). When the
runs saved test hypotheses (`mtrain fit` does), the table adds sacreBLEU's paired bootstrap
of each run against the baseline (the first run unless `baseline=`), as `mtrain eval runs=`.
Runs that differ by their seed only are grouped as one arm: a table over seeds replaces the
run-against-run bootstrap, and the plots draw each arm's mean with a min-max band.
"""

from __future__ import annotations

import sys
from pathlib import Path

from mtrain.cli.common import mtrain_app
from mtrain.cli.overrides import friendly_overrides, hydra_quote
from mtrain.config import ReportConfig
from mtrain.errors import MtrainError


def run_report(cfg: ReportConfig):
    from mtrain.evaluate.compare import compare_runs
    from mtrain.evaluate.runs import default_baseline, discover_runs
    from mtrain.evaluate.sweep import write_sweep_report

    if not cfg.sweep:
        raise MtrainError("no sweep given: `mtrain report SWEEP_DIR` (or sweep=DIR, or sweep=RUN1,RUN2 out=DIR)")
    if cfg.out:
        out = Path(cfg.out)
    elif "," in cfg.sweep:
        raise MtrainError("several run directories given: choose where the report goes with out=DIR")
    else:
        out = Path(cfg.sweep) / "report"
    comparison = None
    if cfg.bootstrap_samples:
        runs = discover_runs(cfg.sweep)
        comparison = compare_runs(runs, None, cfg.baseline or default_baseline(runs), num_samples=cfg.bootstrap_samples)
    elif cfg.baseline:
        raise MtrainError("baseline= needs the bootstrap: drop bootstrap_samples=0")
    return write_sweep_report(cfg.sweep, out, comparison)


# Hydra's own options that take a value (`--cfg job`): their value is not a sweep directory.
_OPTIONS_WITH_VALUE = {
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--info",
    "-i",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
    "--experimental-rerun",
}


def positional_sweep(argv: list[str]) -> list[str]:
    """`mtrain report DIR ...` -> `sweep='DIR' ...` (Hydra only takes key=value)."""
    out = []
    for index, arg in enumerate(argv):
        follows_option = index > 0 and argv[index - 1] in _OPTIONS_WITH_VALUE
        if "=" not in arg and not arg.startswith("-") and not follows_option:
            arg = f"sweep={hydra_quote(arg)}"
        out.append(arg)
    return out


@mtrain_app("report")
def _app(cfg: ReportConfig) -> None:
    run_report(cfg)


def main() -> None:
    sys.argv = sys.argv[:1] + friendly_overrides(
        positional_sweep(sys.argv[1:]), list_keys=(), string_keys=("sweep", "out")
    )
    _app()


if __name__ == "__main__":
    main()
