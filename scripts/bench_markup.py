"""Inline markup's cost by tag count: parsing one line and putting its tags back.

    python scripts/bench_markup.py                      # 1k, 10k, 100k tags
    python scripts/bench_markup.py --tags 1000 10000 --budget 30

Three line shapes, each with N tags on one line: `flat` (`<b>Wort</b> ` repeated: N/2 elements
over one word each), `nested` (N/2 elements, each opening before a word and all closing at the
end: as deep as the line is long), `points` (`Wort<x id="1"/> ` repeated). Each line is parsed
(`parse_markup`, xml) and its tags put back (`restore_markup`) on the identity alignment of its
own words. A shape whose last size took longer than --budget seconds skips the larger sizes
(the figure would only say "quadratic"). Figures are best-of-3 CPU seconds of this process
(`time.process_time`: on a shared machine wall time mostly measures the other processes; the
wall seconds are printed beside them); name the CPU with them.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from mtrain.decode.requests.markup import parse_markup, restore_markup


def flat(tags: int) -> str:
    return "<b>Wort</b> " * (tags // 2)


def nested(tags: int) -> str:
    return "<b>Wort " * (tags // 2) + "</b>" * (tags // 2)


def points(tags: int) -> str:
    return 'Wort<x id="1"/> ' * tags


SHAPES: dict[str, Callable[[int], str]] = {"flat": flat, "nested": nested, "points": points}


def best_of(repeats: int, work: Callable[[], object]) -> tuple[float, float]:
    """The least CPU seconds of `repeats` calls, and the wall seconds of that call."""
    times = []
    for _ in range(repeats):
        cpu, wall = time.process_time(), time.perf_counter()
        work()
        times.append((time.process_time() - cpu, time.perf_counter() - wall))
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tags", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument(
        "--budget", type=float, default=20.0, help="seconds; larger sizes of a slower shape are skipped"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    args = parser.parse_args()
    print(f"{'shape':<8} {'tags':>8} {'parse cpu s':>12} {'place cpu s':>12} {'(wall s)':>14}")
    for name in args.shapes:
        make = SHAPES[name]
        over_budget = False
        for tags in args.tags:
            if over_budget:
                print(f"{name:<8} {tags:>8} {'skipped':>12} (the size before took over --budget)")
                continue
            line = make(tags)
            try:
                parse_s = best_of(args.repeats if tags <= 10_000 else 1, lambda line=line: parse_markup(line, "xml"))
                markup = parse_markup(line, "xml")
                words = markup.text.split()
                links = [(i, i) for i in range(len(words))]
                place_s = best_of(
                    args.repeats if tags <= 10_000 else 1,
                    lambda markup=markup, links=links: restore_markup(markup, markup.text, links),
                )
            except RecursionError:
                print(f"{name:<8} {tags:>8} {'RecursionError':>12}")
                over_budget = True
                continue
            walls = f"({parse_s[1]:.3f}, {place_s[1]:.3f})"
            print(f"{name:<8} {tags:>8} {parse_s[0]:>12.3f} {place_s[0]:>12.3f} {walls:>14}", flush=True)
            over_budget = parse_s[1] + place_s[1] > args.budget


if __name__ == "__main__":
    main()
