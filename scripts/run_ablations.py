#!/usr/bin/env python
"""Run the ablation bench of docs/ABLATIONS.md: every claim's runs, then one report per claim.

Each distinct model is trained once (`mtrain fit`), even where several claims compare
against it: the standard model is shared by every claim at the benchmark's depth. Runs go
to OUT/runs/<name>. A run folder that exists is reused only when its recorded command
(`.hydra/overrides.yaml`) is the one the bench would run: finished, it is kept; interrupted,
`mtrain fit` resumes it. A folder trained with other overrides (another `--updates`, say) is
never reused silently: the bench names the differing overrides and stops before training
anything (delete the folder or choose another `--out`). Then `mtrain report` writes
OUT/reports/<claim>/ (report.md, the loss and BLEU plots, the paired bootstrap against the
claim's reference) for each claim, and OUT/summary.md puts every claim's test BLEU side by
side, per seed and over seeds (mean ± sd,
t interval, Welch's test against the claim's reference).

Each run's start, progress (`update N/M`, every `--progress-every` seconds) and end (`done
in 5m12s: BLEU 31.2` or `FAILED: <reason>`) are printed; its whole output is in
OUT/logs/<name>.log. A failed run makes the bench exit with status 1 once the other runs
and the reports are done. SIGINT or SIGTERM stops the bench: every training is sent the
same signal (each runs in its own process group), saves its checkpoint and stops, and the
bench exits with 128 + the signal's number; the next start resumes those runs.

`--seeds 1,2` repeats every run with each seed (seed 1 is the run's plain name, seed s
adds `_seed<s>`): differences smaller than the spread between seeds are noise.

Several runs go side by side in `--lanes` processes of `--threads` threads each: on a
2-core machine two 1-thread lanes do more work than one 2-thread run, and the runs of a
pair see the same machine. With `--updates` every run gets the same number of updates (a
fair comparison on a noisy machine, where a time budget would give slower models fewer);
without it each run uses its preset's 20-minute time budget.

    python scripts/run_ablations.py --out ablations --updates 600 --warmup 100
    python scripts/run_ablations.py --only positions,residual --dry-run
    python scripts/run_ablations.py --out ablations --updates 600 --warmup 100 --seeds 1,2
    python scripts/run_ablations.py --seeds 2 --runs shared_norm,rmsnorm --updates 600 --warmup 100
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.evaluate.spread import spread, welch_test
from mtrain.run_summary import load_run_summary, read_overrides
from mtrain.rundir import RunDir

BASE = "experiment=ablation_base"  # the benchmark model, instruments on
DEEP = "experiment=ablation_norm_position"  # 6+6 layers, no warmup


@dataclass(frozen=True)
class Run:
    name: str
    overrides: tuple  # experiment preset first, then model switches
    deep: bool = False  # keeps its preset's warmup (0): that is what it tests
    seed: int = 1


RUNS: Sequence[Run] = (
    Run("standard", (BASE,)),
    Run("residual_normalized", (BASE, "model.residual_input=normalized")),
    Run("shared_norm", (BASE, "model.shared_norm=true")),
    Run("cross_q_identity", (BASE, "model.cross_q_proj=false")),
    Run("cross_k_identity", (BASE, "model.cross_k_proj=false")),
    Run("cross_v_identity", (BASE, "model.cross_v_proj=false")),
    Run(
        "cross_qkv_identity", (BASE, "model.cross_q_proj=false", "model.cross_k_proj=false", "model.cross_v_proj=false")
    ),
    Run("order_cross_self_ffn", (BASE, "model.decoder_order=cross_self_ffn")),
    Run("order_self_ffn_cross", (BASE, "model.decoder_order=self_ffn_cross")),
    Run("detach_memory", (BASE, "model.detach_memory=true")),
    Run("deep_pre", (DEEP, "model.norm_position=pre"), deep=True),
    Run("deep_post", (DEEP, "model.norm_position=post"), deep=True),
    # The cure the claim implies: the same Post-LN stack with a warmup.
    Run("deep_post_warmup", (DEEP, "model.norm_position=post", "train.warmup_updates=100"), deep=True),
    # ... and a gentler recipe still (a third of the learning rate, half the budget as warmup):
    # does this Post-LN stack train at all?
    Run("deep_post_gentle", (DEEP, "model.norm_position=post", "train.lr=5e-4", "train.warmup_updates=300"), deep=True),
    Run("post_norm", (BASE, "model.norm_position=post")),
    Run("positions_learned", (BASE, "model.positions=learned")),
    Run("positions_rope", (BASE, "model.positions=rope")),
    Run("positions_none", (BASE, "model.positions=none")),
    Run("final_norm_off", (BASE, "model.final_norm=false")),
    Run("rmsnorm", (BASE, "model.norm_type=rmsnorm")),
    Run("gelu", (BASE, "model.activation=gelu")),
    Run("swiglu", (BASE, "model.activation=swiglu")),
    Run("no_embedding_scale", (BASE, "model.scale_embeddings=false")),
    Run("untied_embeddings", (BASE, "model.tie_embeddings=false")),
)

# Claim -> its runs, the reference first. In the order of docs/ABLATIONS.md.
CLAIMS: dict[str, list[str]] = {
    "norm_position": ["deep_pre", "deep_post", "deep_post_warmup", "deep_post_gentle"],
    "residual": ["standard", "residual_normalized", "post_norm"],
    "shared_norm": ["standard", "shared_norm"],
    "cross_projections": ["standard", "cross_q_identity", "cross_k_identity", "cross_v_identity", "cross_qkv_identity"],
    "decoder_order": ["standard", "order_cross_self_ffn", "order_self_ffn_cross"],
    "detach_memory": ["standard", "detach_memory"],
    "final_norm": ["standard", "final_norm_off"],
    "norm_type": ["standard", "rmsnorm"],
    "activation": ["standard", "gelu", "swiglu"],
    "positions": ["standard", "positions_learned", "positions_rope", "positions_none"],
    "scale_embeddings": ["standard", "no_embedding_scale"],
    "tie_embeddings": ["standard", "untied_embeddings"],
}

# Runs a claim's report shows beside its own when they were trained, but `--only <claim>`
# does not train: Post-LN is not the residual claim's switch, only the form the derivation of
# §2 arrives at. The whole bench trains them; `--runs` names them to train them with `--only`.
SHOWN_BESIDE: dict[str, list[str]] = {"residual": ["post_norm"]}

# Overrides that change how fast a run trains or whether it continues, not what it trains: a
# run is reused whatever they were (`--threads 2` on a bench trained with one thread each;
# train.resume=true, which the bench adds to continue an interrupted run).
NOT_WHAT_IS_TRAINED = {"train.num_threads", "train.resume"}


def seeded_name(name: str, seed: int) -> str:
    return name if seed == 1 else f"{name}_seed{seed}"


def with_seed(run: Run, seed: int) -> Run:
    """The run trained with another seed (seed 1 is the plain run)."""
    if seed == 1:
        return run
    return replace(run, name=seeded_name(run.name, seed), overrides=run.overrides + (f"seed={seed}",), seed=seed)


def label(run: Run) -> str:
    """`post_norm seed=2`: how the bench names a run in its progress lines."""
    return f"{run.name.removesuffix(f'_seed{run.seed}')} seed={run.seed}"


def budget_overrides(run: Run, args: argparse.Namespace) -> list[str]:
    out = [f"train.num_threads={args.threads}"]
    if args.updates:
        out += ["train.max_time=null", "train.max_train_time=null", f"train.max_updates={args.updates}"]
        out.append(f"train.validate_every={args.validate_every or max(1, args.updates // 4)}")
        if args.warmup is not None and not run.deep:
            out.append(f"train.warmup_updates={args.warmup}")
    return out


def run_overrides(run: Run, args: argparse.Namespace) -> list[str]:
    """The overrides of the run's `mtrain fit`, as Hydra records them in .hydra/overrides.yaml."""
    return [*run.overrides, *budget_overrides(run, args), *args.extra]


def command(run: Run, args: argparse.Namespace) -> list[str]:
    """The run's `mtrain fit`; it continues the run from its last checkpoint when it has one
    (an interrupted bench resumes)."""
    run_dir = Path(args.out) / "runs" / run.name
    resume = ["train.resume=true"] if RunDir(run_dir).checkpoint("last").is_file() else []
    return [sys.executable, "-m", "mtrain", "fit", *run_overrides(run, args), *resume, f"hydra.run.dir={run_dir}"]


def reuse_conflict(run: Run, args: argparse.Namespace) -> str | None:
    """Why the run's existing folder cannot be reused for this command; None when there is no
    folder or it was started with the same overrides (up to NOT_WHAT_IS_TRAINED)."""
    run_dir = Path(args.out) / "runs" / run.name
    if not run_dir.exists():
        return None
    recorded = read_overrides(run_dir)
    if not recorded:
        return f"{run_dir} holds no record of its command (.hydra/overrides.yaml); delete it or choose another --out"
    asked = dict(override.partition("=")[::2] for override in run_overrides(run, args))
    keys = (set(recorded) | set(asked)) - NOT_WHAT_IS_TRAINED
    differing = sorted(key for key in keys if recorded.get(key) != asked.get(key))
    if not differing:
        return None

    def shown(overrides: dict[str, str]) -> str:
        return " ".join(f"{key}={overrides[key]}" if key in overrides else f"(no {key})" for key in differing)

    return (
        f"{run_dir} was trained with {shown(recorded)}, this bench asks for {shown(asked)}: "
        "not reusing it; delete it or choose another --out to train it again"
    )


def duration(seconds: float) -> str:
    minutes, seconds = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{seconds:02d}s" if hours else f"{minutes}m{seconds:02d}s"


TRAIN_LINE = re.compile(r"\btrain \| update (\d+)(?:/\d+)? \|")  # (`update N/M` since the lines carry the budget)


def failure_reason(code: int, log_path: Path) -> str:
    """One line: the `mtrain: error:` line of the log, else its last line (a traceback's
    exception), else the exit status."""
    lines = [line.strip() for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines()]
    errors = [line.removeprefix("mtrain: error: ") for line in lines if line.startswith("mtrain: error: ")]
    if code < 0:
        reason = f"killed by {signal.Signals(-code).name}"
    elif errors:
        reason = errors[-1]
    else:
        last = next((line for line in reversed(lines) if line), "")
        reason = f"exit {code}" + (f": {last}" if last else "")
    return f"{reason} (log: {log_path})"


class Bench:
    """Trains runs in lanes, prints their progress, and stops them all on SIGINT/SIGTERM."""

    def __init__(self, runs: Sequence[Run], args: argparse.Namespace) -> None:
        self.runs = runs
        self.args = args
        self.failures: dict[str, str] = {}
        self.stop_signal: int | None = None
        self._children: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def say(self, number: int, run: Run, text: str) -> None:
        print(f"[{number}/{len(self.runs)}] {label(run)}: {text}", flush=True)

    def stop(self, signum: int, _frame: object = None) -> None:
        """The signal handler: forward the signal to every training's process group (a second
        signal kills them outright), and start nothing new."""
        again = self.stop_signal is not None
        self.stop_signal = signum
        with self._lock:
            children = list(self._children)
        for child in children:
            try:
                os.killpg(child.pid, signal.SIGKILL if again else signum)
            except ProcessLookupError:
                pass

    def train_all(self) -> None:
        with ThreadPoolExecutor(max_workers=self.args.lanes) as pool:
            list(pool.map(self.train, range(1, len(self.runs) + 1), self.runs))

    def train(self, number: int, run: Run) -> None:
        run_dir = Path(self.args.out) / "runs" / run.name
        if (run_dir / "metrics.json").exists():
            self.say(number, run, f"done already (same command), BLEU {self.bleu(run)}")
            return
        log_path = Path(self.args.out) / "logs" / f"{run.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(self.args.threads), PYTHONUNBUFFERED="1")
        log_path.write_text("", encoding="utf-8")
        start = time.monotonic()
        with self._lock:
            # Checked under the lock `stop` takes to list the trainings: a signal either comes
            # before (nothing starts) or finds this one (signalled once: a second would kill it
            # before its checkpoint).
            if self.stop_signal is not None:
                return
            # Its own process group: a terminal's Ctrl-C reaches the bench only, which stops
            # the trainings itself, and os.killpg reaches the training's own children too.
            child = subprocess.Popen(
                command(run, self.args),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                text=True,
                errors="replace",
                start_new_session=True,
            )
            self._children.add(child)
        self.say(number, run, f"started (pid {child.pid}, log {log_path})")
        code = self.follow(number, run, child, log_path, start)
        with self._lock:
            self._children.discard(child)
        took = duration(time.monotonic() - start)
        if code == 0:
            self.say(number, run, f"done in {took}: BLEU {self.bleu(run)}")
        elif self.stop_signal is not None:
            self.say(number, run, f"stopped after {took} (the next start resumes it)")
        else:
            reason = failure_reason(code, log_path)
            self.failures[run.name] = reason
            self.say(number, run, f"FAILED after {took}: {reason}")

    def follow(self, number: int, run: Run, child: subprocess.Popen, log_path: Path, start: float) -> int:
        """Copy the training's output to its log; print `update N/M` every --progress-every s."""
        total = f"/{self.args.updates}" if self.args.updates else ""
        last_said = start
        assert child.stdout is not None
        with open(log_path, "a", encoding="utf-8") as log:
            for line in child.stdout:
                log.write(line)
                log.flush()
                match = TRAIN_LINE.search(line)
                if match and time.monotonic() - last_said >= self.args.progress_every:
                    last_said = time.monotonic()
                    self.say(number, run, f"update {match.group(1)}{total} ({duration(last_said - start)})")
        return child.wait()

    def bleu(self, run: Run) -> str:
        score = test_bleu(self.args, run.name)
        return "-" if score is None else f"{score:.2f}"


def report(claim: str, names: Sequence[str], seeds: Sequence[int], args: argparse.Namespace) -> str:
    """One `mtrain report` per claim over every seed of its runs (the reference's first): the
    report groups a run's seeds into one arm (mean, spread, bootstrap over sentences and seeds)."""
    paths = [Path(args.out) / "runs" / seeded_name(name, seed) for name in names for seed in seeds]
    present = [path for path in paths if (path / "metrics.json").is_file()]
    references = {seeded_name(names[0], seed) for seed in seeds}
    out = Path(args.out) / "reports" / claim
    if not present or present[0].name not in references or all(path.name in references for path in present):
        return f"{out.name}: no report, the reference or every other run is missing"
    runs = ",".join(str(path) for path in present)
    code = subprocess.call(
        [sys.executable, "-m", "mtrain", "report", f"sweep={runs}", f"out={out}"], stdout=subprocess.DEVNULL
    )
    return f"{out.name}: {out / 'report.md'}" if code == 0 else f"{out.name}: report failed (exit {code})"


def test_bleu(args: argparse.Namespace, name: str) -> float | None:
    """A run's test BLEU, read as `mtrain report` reads it (None when it has not finished)."""
    path = Path(args.out) / "runs" / name
    return load_run_summary(path).score("test") if path.is_dir() else None


def summary(
    claims: Sequence[str], seeds: Sequence[int], args: argparse.Namespace, failures: Mapping[str, str] | None = None
) -> str:
    """Markdown: per claim, each run's test BLEU per seed, its spread over seeds, and the gap to the
    reference; a run that failed in this bench reads `failed` (its reason is in the bench's output).

    "over seeds" is the mean ± sample standard deviation [95% Student-t interval] of the seeds a
    run has. The gap averages per-seed differences over the seeds both runs have, so a run trained
    with fewer seeds is compared like with like; Welch's t-test over the two runs' seeds says
    whether that gap stands out from the seed-to-seed spread (two seeds each at least).
    """
    lines = [
        f"# Ablation bench summary ({args.out})",
        "",
        "Test BLEU (sacreBLEU 13a) per seed; over seeds: mean ± sd [95% t interval]; Δ: the mean per-seed",
        "difference to the claim's first run, over the seeds both have (n); p: Welch's t-test over seeds.",
        "",
    ]
    for claim in claims:
        names = CLAIMS[claim]
        lines += [
            f"## {claim}",
            "",
            "| run | " + " | ".join(f"seed {s}" for s in seeds) + " | over seeds | Δ | n | p (Welch) |",
            "|---|" + "---|" * (len(seeds) + 4),
        ]
        reference = [test_bleu(args, seeded_name(names[0], seed)) for seed in seeds]
        reference_known = [score for score in reference if score is not None]
        for name in names:
            scores = [test_bleu(args, seeded_name(name, seed)) for seed in seeds]
            known = [score for score in scores if score is not None]
            gaps = [
                score - ref
                for score, ref in zip(scores, reference, strict=True)
                if score is not None and ref is not None
            ]
            delta = f"{sum(gaps) / len(gaps):+.2f}" if gaps and name != names[0] else "-"
            welch = welch_test(known, reference_known) if name != names[0] else None
            cells = [
                ("failed" if seeded_name(name, seed) in (failures or {}) else "-") if score is None else f"{score:.2f}"
                for score, seed in zip(scores, seeds, strict=True)
            ]
            lines.append(
                f"| {name} | "
                + " | ".join(cells)
                + f" | {_over_seeds(known)} | {delta} | {len(gaps) if delta != '-' else '-'} |"
                + f" {'-' if welch is None else f'{welch.p_value:.4f}'} |"
            )
        lines.append("")
    return "\n".join(lines)


def _over_seeds(scores: Sequence[float]) -> str:
    if not scores:
        return "-"
    seeds = spread(scores)
    if seeds.std is None or seeds.ci is None:
        return f"{seeds.mean:.2f} (1 seed)"
    return f"{seeds.mean:.2f} ± {seeds.std:.2f} [{seeds.mean - seeds.ci:.2f}, {seeds.mean + seeds.ci:.2f}]"


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line, with `claims`, `seeds` (as lists) and `planned` (the Runs to train, seeds applied)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="ablations", help="bench directory (runs/, logs/, reports/)")
    parser.add_argument("--only", default=None, help=f"comma-separated claims; all: {','.join(CLAIMS)}")
    parser.add_argument(
        "--updates", type=int, default=None, help="updates per run (default: the presets' 20-minute time budget)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warmup updates with --updates (not for the no-warmup norm_position runs)",
    )
    parser.add_argument("--validate-every", type=int, default=None, help="default with --updates: updates/4")
    parser.add_argument(
        "--runs", default=None, help="comma-separated run names: train only these (of the claims chosen)"
    )
    parser.add_argument("--seeds", default="1", help="comma-separated seeds; each run is trained with each")
    parser.add_argument("--lanes", type=int, default=2, help="runs side by side")
    parser.add_argument("--threads", type=int, default=1, help="threads per run")
    parser.add_argument(
        "--progress-every", type=float, default=60.0, help="seconds between a run's `update N/M` lines (default 60)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument(
        "--report-only", action="store_true", help="train nothing: reports and summary of the finished runs"
    )
    parser.add_argument("extra", nargs="*", help="more overrides for every run (e.g. data.train_limit=2000)")
    args = parser.parse_args(argv)

    claims = list(CLAIMS) if args.only is None else [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in claims if c not in CLAIMS]
    if unknown:
        parser.error(f"--only: unknown claim(s) {', '.join(unknown)}; known: {', '.join(CLAIMS)}")
    seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    wanted = {name for claim in claims for name in CLAIMS[claim]}
    if args.runs is None and args.only is not None:
        wanted -= {name for claim in claims for name in SHOWN_BESIDE.get(claim, [])}
    if args.runs is not None:
        chosen = {name.strip() for name in args.runs.split(",") if name.strip()}
        if chosen - wanted:
            parser.error(
                f"--runs: {', '.join(sorted(chosen - wanted))} not in the claims chosen; "
                f"known: {', '.join(run.name for run in RUNS)}"
            )
        wanted = chosen
    # All of seed 1 first: a bench stopped early has whole claims.
    args.planned = [with_seed(run, seed) for seed in seeds for run in RUNS if run.name in wanted]
    args.claims, args.seeds = claims, seeds
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_arguments(argv)
    claims, seeds, runs = args.claims, args.seeds, args.planned
    if args.dry_run:
        for run in runs:
            print(" ".join(command(run, args)))
        return
    if args.report_only:
        runs = []
    conflicts = [conflict for run in runs if (conflict := reuse_conflict(run, args))]
    if conflicts:
        for conflict in conflicts:
            print(f"run_ablations: error: {conflict}", file=sys.stderr)
        sys.exit(2)
    bench = Bench(runs, args)
    signal.signal(signal.SIGINT, bench.stop)
    signal.signal(signal.SIGTERM, bench.stop)
    bench.train_all()
    if bench.stop_signal is not None:
        print(f"stopped by {signal.Signals(bench.stop_signal).name}: no reports written", file=sys.stderr)
        sys.exit(128 + bench.stop_signal)
    for claim in claims:
        print(report(claim, CLAIMS[claim], seeds, args), flush=True)
    text = summary(claims, seeds, args, bench.failures)
    (Path(args.out) / "summary.md").write_text(text + "\n", encoding="utf-8")
    print(text)
    if bench.failures:
        print(f"{len(bench.failures)} run(s) failed:", file=sys.stderr)
        for name, reason in bench.failures.items():
            print(f"  {name}: {reason}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
