"""Interactive `mtrain translate` latency: from a line typed at a terminal to its translation.

    python scripts/bench_interactive.py --run runs/m30k                   # 50 Multi30k test sentences, beam 5
    python scripts/bench_interactive.py --run runs/m30k --sentences 100 --threads 2 --set precision=fp32

Starts `mtrain translate run=RUN decode.beam=5` as a user would at a terminal: its stdin on a
pseudo-terminal (so it runs interactively, `interactive=null`), stdout and stderr on pipes.
Each sentence of $MTRAIN_DATA_DIR/multi30k/test_2016_flickr.de.gz (or --input) is typed
once the previous translation has arrived, and the time from the keystrokes to the
translation's line on stdout is its latency. Prints the time the command took to be ready
(from the process start to its "translating with" log line: Python, torch and mtrain's
imports and the model load) apart from the latencies: p50, p90 and max over every line,
and the first line alone (its decode warms the model up). Ctrl-D ends the command; its
exit status must be 0.
"""

from __future__ import annotations

import argparse
import gzip
import os
import select
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
READY_LINE = "translating with"  # what mtrain translate logs once its engine is open


def default_input() -> Path:
    data = Path(os.environ.get("MTRAIN_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))
    return data / "multi30k" / "test_2016_flickr.de.gz"


def read_sentences(path: Path, count: int) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        lines = [line.rstrip("\n") for line in handle if line.strip()]
    return lines[:count]


def read_line(fd: int, timeout: float) -> str:
    """One line of `fd` (byte by byte: nothing of a later line is consumed)."""
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            raise SystemExit(f"no translation within {timeout:.0f}s (read so far: {data!r})")
        byte = os.read(fd, 1)
        if not byte:
            raise SystemExit(f"mtrain translate closed its output (read so far: {data!r})")
        data += byte
    return data.decode("utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True, help="a run directory written by `mtrain fit`")
    parser.add_argument("--input", type=Path, default=None, help="sentences to type (default: Multi30k test de)")
    parser.add_argument("--sentences", type=int, default=50)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="num_threads= of mtrain translate")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="more overrides for mtrain translate (e.g. precision=fp32)",
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for the model, or a line")
    args = parser.parse_args()

    sentences = read_sentences(args.input or default_input(), args.sentences)
    command = [
        sys.executable,
        "-m",
        "mtrain",
        "translate",
        f"run={args.run}",
        f"decode.beam={args.beam}",
        f"num_threads={args.threads}",
        *args.set,
    ]
    master, slave = os.openpty()
    attributes = termios.tcgetattr(slave)
    attributes[3] &= ~termios.ECHO  # what is typed is not echoed back to be drained
    termios.tcsetattr(slave, termios.TCSANOW, attributes)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}

    started = time.perf_counter()
    process = subprocess.Popen(command, stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    ready = threading.Event()
    log_lines: list[str] = []
    ready_at = [0.0]

    def drain_stderr() -> None:  # a full stderr pipe would stall the command
        for raw in process.stderr:
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            log_lines.append(line)
            if READY_LINE in line and not ready.is_set():
                ready_at[0] = time.perf_counter()
                ready.set()

    reader = threading.Thread(target=drain_stderr, daemon=True)
    reader.start()
    try:
        if not ready.wait(args.timeout) or process.poll() is not None:
            raise SystemExit("mtrain translate did not get ready:\n" + "\n".join(log_lines[-20:]))
        load_s = ready_at[0] - started
        latencies = []
        for sentence in sentences:
            typed = time.perf_counter()
            os.write(master, sentence.encode("utf-8") + b"\n")
            read_line(process.stdout.fileno(), args.timeout)
            latencies.append(time.perf_counter() - typed)
        os.write(master, b"\x04")  # Ctrl-D
        status = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    reader.join(timeout=5)
    if status != 0:
        raise SystemExit(f"mtrain translate exited with {status}:\n" + "\n".join(log_lines[-20:]))

    ms = np.array(latencies) * 1000
    engine = next((line.split(READY_LINE, 1)[1].strip() for line in log_lines if READY_LINE in line), "?")
    print(f"run: {args.run}  ({engine})")
    print(f"ready after {load_s:.2f} s (process start to the engine opened: imports and model load)")
    print(f"{len(ms)} lines typed, each after the previous translation arrived; latency in ms:")
    print(
        f"  p50 {np.percentile(ms, 50):.1f}  p90 {np.percentile(ms, 90):.1f}  max {ms.max():.1f}  "
        f"(first line {ms[0]:.1f}; without it: p50 {np.percentile(ms[1:], 50) if len(ms) > 1 else ms[0]:.1f})"
    )


if __name__ == "__main__":
    main()
