"""Evaluation: sacreBLEU metrics, scoring, run reports, run comparison, sweep reports, checkpoint averaging.

metrics.py     score_corpus / score_files: BLEU, chrF(++), TER with signatures
references.py  a run's split text and file fingerprints
scoring.py     the one evaluation path: translate and score a split (score_split: and report it)
scored.py      Scored: a split translated and scored, what scoring returns and report writes
report.py      a scored split's report: eval/<split>.{json,md,hyp}
sentences.py   per-sentence BLEU, chrF and model scores: <split>.sentences.tsv, the worst lines
calibration.py a run's confidence calibration (mtrain.decode.translation.confidence) from decoded sentences
runs.py        run discovery in a sweep directory or a list of runs (one run's record: mtrain.run_summary)
compare.py     the runs table and sacreBLEU's paired bootstrap against a baseline
arms.py        runs of one configuration across seeds, grouped as arms
arm_comparison.py  arms over seeds: spread, Welch, and arm_bootstrap.py (sentences and seeds resampled)
spread.py      mean, sd, Student-t interval and Welch's t-test (no scipy)
curves.py      TensorBoard scalars of a run and their plots
sweep.py       `mtrain report SWEEP_DIR`: Markdown tables and plots (PNG, SVG)
average.py     checkpoint averaging (fairseq semantics)
"""

from mtrain.evaluate.metrics import METRIC_NAMES, score_corpus, score_files

__all__ = ["METRIC_NAMES", "score_corpus", "score_files"]
