"""Benchmark `prepare_data` at scale: pairs/s and peak memory on a synthetic corpus.

Builds an N-pair corpus from Multi30k's training set repeated with perturbations (word
swaps, dropped words, numbers, casing) in a temporary directory, then prepares it with WMT
cleaning settings (deduplication, identical-pair removal). Prints the tokenizer training
time, the encoding throughput, and peak resident memory: the main process, the largest
worker, and the largest sum over the process tree sampled every 0.2 s, per phase.

    python scripts/bench_prepare.py --pairs 1000000 --workers 2
"""

from __future__ import annotations

import argparse
import gzip
import os
import random
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mtrain.batches.prepare import prepare_data
from mtrain.config import DataConfig, TokenizerConfig
from mtrain.tokenizer import train_or_load_tokenizer


def perturb(words: list, rng: random.Random) -> list:
    words = list(words)
    choice = rng.randrange(5)
    if choice == 0 and len(words) > 3:
        i, j = rng.sample(range(len(words)), 2)
        words[i], words[j] = words[j], words[i]
    elif choice == 1 and len(words) > 4:
        del words[rng.randrange(len(words))]
    elif choice == 2:
        words.insert(rng.randrange(len(words) + 1), str(rng.randrange(1000)))
    elif choice == 3:
        words = [w.upper() if rng.random() < 0.2 else w for w in words]
    return words


def build_corpus(multi30k: Path, out: Path, pairs: int, seed: int = 1) -> None:
    """train.{de,en}: Multi30k repeated with perturbations; val/test copied."""
    out.mkdir(parents=True, exist_ok=True)
    with gzip.open(multi30k / "train.de.gz", "rt", encoding="utf-8") as f:
        german = [line.split() for line in f]
    with gzip.open(multi30k / "train.en.gz", "rt", encoding="utf-8") as f:
        english = [line.split() for line in f]
    rng = random.Random(seed)
    with open(out / "train.de", "w", encoding="utf-8") as de, open(out / "train.en", "w", encoding="utf-8") as en:
        for n in range(pairs):
            i = n % len(german)
            first_round = n < len(german)
            de.write(" ".join(german[i] if first_round else perturb(german[i], rng)) + "\n")
            en.write(" ".join(english[i] if first_round else perturb(english[i], rng)) + "\n")
    for split in ("val", "test_2016_flickr"):
        for lang in ("de", "en"):
            shutil.copyfile(multi30k / f"{split}.{lang}.gz", out / f"{split}.{lang}.gz")


class TreeMemorySampler(threading.Thread):
    """Largest sum of VmRSS over this process and its children, sampled periodically."""

    def __init__(self, interval: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.peak_kib = 0
        self.running = True

    @staticmethod
    def _rss_kib(pid: int) -> int:
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except OSError:
            pass
        return 0

    def _tree(self) -> list:
        pids, frontier = [], [os.getpid()]
        while frontier:
            pid = frontier.pop()
            pids.append(pid)
            try:
                with open(f"/proc/{pid}/task/{pid}/children") as children:
                    frontier += [int(child) for child in children.read().split()]
            except OSError:
                pass
        return pids

    def run(self) -> None:
        while self.running:
            self.peak_kib = max(self.peak_kib, sum(self._rss_kib(pid) for pid in self._tree()))
            time.sleep(self.interval)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chunk-size", type=int, default=100_000)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-sentences", type=int, default=2_000_000)
    parser.add_argument(
        "--data",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared" / "data",
        help="directory holding multi30k/ (default ../shared/data)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="keep the corpus and cache here")
    args = parser.parse_args()

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    corpus = workdir / "corpus"
    start = time.perf_counter()
    build_corpus(args.data / "multi30k", corpus, args.pairs)
    size_mb = sum(p.stat().st_size for p in corpus.iterdir()) / 1e6
    print(f"corpus: {args.pairs:,} pairs, {size_mb:,.0f} MB, built in {time.perf_counter() - start:.1f} s")

    data = DataConfig(
        local_dir=str(corpus), cache_dir=str(workdir / "cache"), num_workers=args.workers, chunk_size=args.chunk_size
    )
    data.clean.deduplicate = True
    data.clean.drop_identical = True
    tokenizer_cfg = TokenizerConfig(vocab_size=args.vocab_size, max_sentences=args.max_sentences)

    sampler = TreeMemorySampler()
    sampler.start()
    start = time.perf_counter()
    train_or_load_tokenizer(tokenizer_cfg, data, log=print)
    tokenizer_seconds = time.perf_counter() - start
    tokenizer_peak_kib, sampler.peak_kib = sampler.peak_kib, 0
    start = time.perf_counter()
    prepared = prepare_data(data, tokenizer_cfg, log=print)
    encode_seconds = time.perf_counter() - start
    sampler.running = False
    sampler.join()

    main_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    total = tokenizer_seconds + encode_seconds
    print()
    print(f"pairs                  {args.pairs:,} ({len(prepared.train):,} kept), workers {args.workers}")
    print(f"tokenizer training     {tokenizer_seconds:.1f} s (max_sentences {args.max_sentences:,})")
    print(f"encoding               {encode_seconds:.1f} s = {args.pairs / encode_seconds:,.0f} pairs/s")
    print(f"total                  {total:.1f} s = {args.pairs / total:,.0f} pairs/s")
    print(f"peak RSS main process  {main_peak:,.0f} MiB")
    print(f"peak RSS one worker    {child_peak:,.0f} MiB")
    print(
        f"peak RSS process tree  {tokenizer_peak_kib / 1024:,.0f} MiB while training the tokenizer, "
        f"{sampler.peak_kib / 1024:,.0f} MiB while encoding (sampled every 0.2 s)"
    )
    if args.workdir is None:
        shutil.rmtree(workdir)


if __name__ == "__main__":
    main()
