"""`mtrain serve` under load: sentences/s and latency at 1, 8 and 64 concurrent clients, against
`mtrain translate` on the same sentences, and whether both translate alike.

    python scripts/bench_serve.py runs/m30k                                # Multi30k test_2016_flickr.de
    python scripts/bench_serve.py runs/m30k --ensemble runs/a,runs/b --sentences 300
    python scripts/bench_serve.py runs/m30k_ct2 --engine ctranslate2 --concurrency 1,8
    python scripts/bench_serve.py runs/m30k -- decode.beam=4 precision=fp32  # more keys for both
    python scripts/bench_serve.py runs/m30k --api native,libretranslate --concurrency 8  # both APIs

Starts `mtrain serve RUN port=0` on 127.0.0.1 (any free port), then, for each concurrency C,
C client threads (one httpx connection each) send one sentence per request, taking the next
unsent sentence until all `--sentences` are sent or `--time-limit` seconds have passed; a
request's latency is from its send to its answer. `--api` chooses the requests: mtrain's own
(`{"text": [sentence]}`, by default) and/or LibreTranslate's (`{"q": sentence, "source": ...,
"target": ...}`, the languages from GET /languages), each API at each concurrency in turn. Then the server is stopped with SIGTERM
(it must exit 0), and `mtrain translate` decodes the same sentences from a file with the same
settings; its sentences/s are given for the whole command and without its start-up (a
one-line run's time subtracted). Every served translation is compared with translate's line.

Bounded: at most --sentences requests per concurrency (1,000 by default, the size of the
test set), each concurrency stopped after --time-limit seconds (60), every process given a
timeout. On a machine with few cores the client threads take CPU time from the server:
read the figures of 64 clients as the server's throughput under load, not its latency alone.

Measured (AMD EPYC, avx2 avx512_bf16, 2 cores shared with other jobs, load 2-4; a 3+3 layer
d_model 256 Multi30k run, beam 5, 1 thread, 100 sentences, 15 s a concurrency;
`python scripts/bench_serve.py RUN --sentences 100 --time-limit 15 -- precision=fp32`):

    clients  sent/s  p50 ms  p99 ms  batches   = translate
          1     6.1     159     314   92 / 92    92/92
          8    20.4     339     610   19 / 100  100/100
         64    21.9    1412    2912    4 / 100  100/100
    mtrain translate on the file: 43.5 sent/s without its start-up (9.7 with it)

With precision=auto (bf16 on that CPU) 1 sentence of 100 differed at 1 client: bf16 sums
depend on the batch a sentence is decoded in (its padding), and `mtrain translate` of that
line alone gives the server's output; in fp32 they agreed on all 100 at every concurrency.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}


def default_input() -> Path:
    data = Path(os.environ.get("MTRAIN_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))
    return data / "multi30k" / "test_2016_flickr.de.gz"


def read_sentences(path: Path, limit: int) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(limit), f, strict=False)]


def mtrain_command(command: str, run: str, args: argparse.Namespace) -> list[str]:
    """The settings both commands share: run, engine, threads, ensemble, and the extra keys."""
    keys = [f"run={run}", f"engine={args.engine}", f"num_threads={args.threads}"]
    if args.ensemble:
        keys.append(f"ensemble=[{args.ensemble}]")
    return [sys.executable, "-m", "mtrain", command, *keys, *args.overrides]


class Server:
    def __init__(self, command: list[str], log_path: Path, start_timeout: float = 300) -> None:
        self.log_path = log_path
        self.log = log_path.open("wb")
        self.process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + start_timeout
        while not (found := re.search(r"on http://127\.0\.0\.1:(\d+)\n", self.stderr())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                sys.exit(f"bench_serve: the server did not start:\n{self.stderr()}")
            time.sleep(0.1)
        self.url = f"http://127.0.0.1:{found.group(1)}"

    def stderr(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            self.log.close()


def request_body(api: str, sentence: str, languages: tuple[str, str]) -> dict:
    if api == "libretranslate":
        return {"q": sentence, "source": languages[0], "target": languages[1]}
    return {"text": [sentence]}


def translation(api: str, answer: dict) -> str:
    return answer["translatedText"] if api == "libretranslate" else answer["translations"][0]


def load(url: str, sentences: list[str], clients: int, time_limit: float, api: str = "native") -> dict:
    """`clients` threads sending one sentence per request (of `api`) until all are sent or time is up."""
    import httpx

    listed = httpx.get(f"{url}/languages", timeout=30).json() if api == "libretranslate" else []
    source = next((language for language in listed if language["targets"]), {"code": "", "targets": [""]})
    languages = (source["code"], source["targets"][0])

    outputs: list[str | None] = [None] * len(sentences)
    latencies: list[float] = []
    errors: list[str] = []
    next_index, lock = [0], threading.Lock()
    deadline = time.monotonic() + time_limit

    def client() -> None:
        with httpx.Client(timeout=120) as http:
            while time.monotonic() < deadline:
                with lock:
                    index = next_index[0]
                    next_index[0] += 1
                if index >= len(sentences):
                    return
                sent = time.perf_counter()
                response = http.post(f"{url}/translate", json=request_body(api, sentences[index], languages))
                took = time.perf_counter() - sent
                with lock:
                    if response.status_code == 200:
                        outputs[index] = translation(api, response.json())
                        latencies.append(took)
                    else:
                        errors.append(f"{response.status_code} {response.text[:200]}")

    before = httpx.get(f"{url}/health", timeout=30).json()
    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - start
    after = httpx.get(f"{url}/health", timeout=30).json()
    done = len(latencies)
    ordered = sorted(latencies) or [float("nan")]
    return {
        "api": api,
        "clients": clients,
        "done": done,
        "errors": errors,
        "outputs": outputs,
        "wall": wall,
        "sentences_per_s": done / wall,
        "p50_ms": 1000 * statistics.median(ordered),
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "batches": after["batches"] - before["batches"],
    }


def translate_file(command: list[str], source: Path, output: Path) -> float:
    """Seconds the whole `mtrain translate input=source output=output` took."""
    start = time.perf_counter()
    result = subprocess.run(
        command + [f"input={source}", f"output={output}"], env=ENV, capture_output=True, timeout=3600
    )
    if result.returncode != 0:
        sys.exit(f"bench_serve: mtrain translate failed:\n{result.stderr.decode(errors='replace')}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run directory (or an `mtrain export` directory with --engine ctranslate2)")
    parser.add_argument("--ensemble", default="", help="comma-separated runs decoded with RUN (ensemble=[...])")
    parser.add_argument("--engine", default="torch", choices=("torch", "ctranslate2"))
    parser.add_argument("--threads", type=int, default=1, help="num_threads of both commands")
    parser.add_argument("--input", type=Path, default=default_input(), help="sentences, one a line (.gz too)")
    parser.add_argument("--sentences", type=int, default=1000, help="at most this many (per concurrency)")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated client counts")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per concurrency")
    parser.add_argument("--api", default="native", help="comma-separated: native (mtrain's), libretranslate")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)  # after --: KEY=VALUE for both commands
    args = parser.parse_args(argv[:split])
    args.overrides = argv[split + 1 :]

    sentences = read_sentences(args.input, args.sentences)
    scratch = Path(tempfile.mkdtemp(prefix="bench_serve-"))
    server = Server(mtrain_command("serve", args.run, args) + ["port=0"], scratch / "serve.log")
    try:
        import httpx

        httpx.post(f"{server.url}/translate", json={"text": sentences[:1]}, timeout=120)  # warm-up
        health = httpx.get(f"{server.url}/health", timeout=30).json()
        print(
            f"model: {health['model']} ({health['engine']} on {health['device']}, {health['threads']} thread(s), "
            f"beam {health['decode']['beam']}); {len(sentences)} sentences from {args.input}",
            flush=True,
        )
        rows = []
        for clients in (int(c) for c in args.concurrency.split(",")):
            for api in args.api.split(","):
                rows.append(load(server.url, sentences, clients, args.time_limit, api))
                print(
                    f"  {api}, {clients} clients: {rows[-1]['done']} sentences in {rows[-1]['wall']:.1f} s", flush=True
                )
    finally:
        status = server.stop()
    if status != 0:
        sys.exit(f"bench_serve: the server exited with status {status} after SIGTERM:\n{server.stderr()}")

    source, output = scratch / "input.txt", scratch / "translate.out"
    source.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    translate = mtrain_command("translate", args.run, args)
    seconds = translate_file(translate, source, output)
    (scratch / "one.txt").write_text(sentences[0] + "\n", encoding="utf-8")
    start_up = translate_file(translate, scratch / "one.txt", scratch / "one.out")
    expected = output.read_text(encoding="utf-8").split("\n")[: len(sentences)]

    print()
    print(
        f"| {'api':>14} | {'client(s)':>9} | {'sentences':>9} | {'sent/s':>7} | {'p50 ms':>7} | {'p99 ms':>7} | "
        f"{'batches':>7} | {'= translate':>11} | errors |"
    )
    print("|" + "|".join("-" * (width + 2) for width in (14, 9, 9, 7, 7, 7, 7, 11, 6)) + "|")
    mismatched, first_mismatch = 0, None
    for row in rows:
        compared = [
            (i, got, want)
            for i, (got, want) in enumerate(zip(row["outputs"], expected, strict=True))
            if got is not None
        ]
        same = sum(got == want for _, got, want in compared)
        mismatched += len(compared) - same
        first_mismatch = first_mismatch or next(
            ((row["clients"], i, got, want) for i, got, want in compared if got != want), None
        )
        print(
            f"| {row['api']:>14} | {row['clients']:>9} | {row['done']:>9} | {row['sentences_per_s']:>7.1f} | {row['p50_ms']:>7.1f} | "
            f"{row['p99_ms']:>7.1f} | {row['batches']:>7} | {f'{same}/{len(compared)}':>11} | "
            f"{len(row['errors']):>6} |"
        )
    decode_only = max(seconds - start_up, 1e-9)
    print(
        f"\nmtrain translate, {len(sentences)} sentences from a file: {len(sentences) / seconds:.1f} sent/s for the "
        f"whole command ({seconds:.1f} s), {len(sentences) / decode_only:.1f} sent/s without its start-up "
        f"({start_up:.1f} s for one line)"
    )
    errors = [error for row in rows for error in row["errors"]]
    if errors:
        print(f"first error: {errors[0]}")
    print(
        "outputs: "
        + (
            "the server's equal translate's"
            if not mismatched
            else f"{mismatched} served translations differ from translate's"
        )
    )
    if first_mismatch:
        clients, index, got, want = first_mismatch
        print(
            f"first difference ({clients} clients), line {index + 1}: {sentences[index]!r}\n"
            f"  served:    {got!r}\n  translate: {want!r}"
        )
    sys.exit(1 if mismatched or errors else 0)


if __name__ == "__main__":
    main()
