"""The test files that take longest, from a `pytest --durations=0` log: the order tests/conftest.py
gives pytest-xdist (SLOWEST_FILES), so that the long files start first and the short ones fill
the workers' last minutes.

    python -m pytest tests --durations=0 > suite.log; python scripts/slowest_test_files.py suite.log
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

DURATION = re.compile(r"\s*([\d.]+)s (?:call|setup|teardown)\s+tests/([\w/]+\.py)::")


def file_seconds(log_lines: list[str]) -> Counter[str]:
    """Seconds per test file: its tests' setup, call and teardown summed."""
    seconds: Counter[str] = Counter()
    for line in log_lines:
        match = DURATION.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", help="the output of `python -m pytest tests --durations=0`")
    parser.add_argument("--top", type=int, default=24, help="how many files to list (default 24)")
    args = parser.parse_args()
    with open(args.log, encoding="utf-8") as log:
        seconds = file_seconds(log.readlines())
    total = sum(seconds.values())
    for name, spent in seconds.most_common(args.top):
        print(f"{spent:8.1f} s  {spent / total:5.1%}  {name}")
    print(f"{total:8.1f} s in all, {len(seconds)} files\n\nSLOWEST_FILES = (")
    for name, _ in seconds.most_common(args.top):
        print(f'    "{name}",')
    print(")")


if __name__ == "__main__":
    main()
