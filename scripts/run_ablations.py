#!/usr/bin/env python
"""Run the ablation bench of docs/ABLATIONS.md: every claim's runs, then one report per claim.

Each distinct model is trained once (`mtrain fit`), even where several claims compare
against it: the standard model is shared by every claim at the benchmark's depth. Runs go
to OUT/runs/<name> and are skipped when their metrics.json exists, so an interrupted bench
resumes where it stopped. Then `mtrain report` writes OUT/reports/<claim>/ (report.md, the
loss and BLEU plots, the paired bootstrap against the claim's reference) for each claim, and
OUT/summary.md puts every claim's test BLEU side by side, per seed and over seeds (mean ± sd,
t interval, Welch's test against the claim's reference).

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
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.evaluate.runs import load_run_summary
from mtrain.evaluate.spread import spread, welch_test

BASE = "experiment=ablation_base"  # the benchmark model, instruments on
DEEP = "experiment=ablation_norm_position"  # 6+6 layers, no warmup


@dataclass(frozen=True)
class Run:
    name: str
    overrides: tuple  # experiment preset first, then model switches
    deep: bool = False  # keeps its preset's warmup (0): that is what it tests


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


def seeded_name(name: str, seed: int) -> str:
    return name if seed == 1 else f"{name}_seed{seed}"


def with_seed(run: Run, seed: int) -> Run:
    """The run trained with another seed (seed 1 is the plain run)."""
    if seed == 1:
        return run
    return replace(run, name=seeded_name(run.name, seed), overrides=run.overrides + (f"seed={seed}",))


def budget_overrides(run: Run, args: argparse.Namespace) -> list[str]:
    out = [f"train.num_threads={args.threads}"]
    if args.updates:
        out += ["train.max_time=null", "train.max_train_time=null", f"train.max_updates={args.updates}"]
        out.append(f"train.validate_every={args.validate_every or max(1, args.updates // 4)}")
        if args.warmup is not None and not run.deep:
            out.append(f"train.warmup_updates={args.warmup}")
    return out


def command(run: Run, args: argparse.Namespace) -> list[str]:
    run_dir = Path(args.out) / "runs" / run.name
    return [
        sys.executable,
        "-m",
        "mtrain",
        "fit",
        *run.overrides,
        *budget_overrides(run, args),
        *args.extra,
        f"hydra.run.dir={run_dir}",
    ]


def train(run: Run, args: argparse.Namespace) -> str:
    run_dir = Path(args.out) / "runs" / run.name
    if (run_dir / "metrics.json").exists():
        return f"{run.name}: done already"
    log_path = Path(args.out) / "logs" / f"{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    start = time.time()
    with open(log_path, "w") as log:
        code = subprocess.call(command(run, args), stdout=log, stderr=subprocess.STDOUT, env=env)
    status = "ok" if code == 0 else f"exit {code}, see {log_path}"
    return f"{run.name}: {status} in {time.time() - start:.0f} s"


def report(claim: str, names: Sequence[str], seed: int, args: argparse.Namespace) -> str:
    paths = [Path(args.out) / "runs" / seeded_name(name, seed) for name in names]
    present = [path for path in paths if (path / "metrics.json").is_file()]
    out = Path(args.out) / "reports" / seeded_name(claim, seed)
    if len(present) < 2 or present[0] != paths[0]:
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


def summary(claims: Sequence[str], seeds: Sequence[int], args: argparse.Namespace) -> str:
    """Markdown: per claim, each run's test BLEU per seed, its spread over seeds, and the gap to the reference.

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
            cells = ["-" if score is None else f"{score:.2f}" for score in scores]
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


def main() -> None:
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
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument(
        "--report-only", action="store_true", help="train nothing: reports and summary of the finished runs"
    )
    parser.add_argument("extra", nargs="*", help="more overrides for every run (e.g. data.train_limit=2000)")
    args = parser.parse_args()

    claims = list(CLAIMS) if args.only is None else [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in claims if c not in CLAIMS]
    if unknown:
        parser.error(f"--only: unknown claim(s) {', '.join(unknown)}; known: {', '.join(CLAIMS)}")
    seeds = [int(seed) for seed in args.seeds.split(",") if seed.strip()]
    wanted = {name for claim in claims for name in CLAIMS[claim]}
    if args.runs is not None:
        chosen = {name.strip() for name in args.runs.split(",") if name.strip()}
        if chosen - wanted:
            parser.error(
                f"--runs: {', '.join(sorted(chosen - wanted))} not in the claims chosen; "
                f"known: {', '.join(run.name for run in RUNS)}"
            )
        wanted = chosen
    # All of seed 1 first: a bench stopped early has whole claims.
    runs = [with_seed(run, seed) for seed in seeds for run in RUNS if run.name in wanted]

    if args.dry_run:
        for run in runs:
            print(" ".join(command(run, args)))
        return
    if args.report_only:
        runs = []
    with ThreadPoolExecutor(max_workers=args.lanes) as pool:
        for line in pool.map(lambda run: train(run, args), runs):
            print(line, flush=True)
    for seed in seeds:
        for claim in claims:
            print(report(claim, CLAIMS[claim], seed, args), flush=True)
    text = summary(claims, seeds, args)
    (Path(args.out) / "summary.md").write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
