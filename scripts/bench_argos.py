"""`mtrain export format=argos`: the export's time and size, Argos Translate's sentences/s against
mtrain's CTranslate2 engine on the same file, and how many lines they translate alike.

    python scripts/bench_argos.py runs/m30k                        # Multi30k test_2016_flickr.de
    python scripts/bench_argos.py runs/m30k --sentences 300 --quantization int8

Exports RUN twice, both timed (`mtrain export`, the whole command): an Argos package and a
CTranslate2 directory. mtrain's side decodes the sentences in-process with the CTranslate2
engine (`mtrain translate engine=ctranslate2`'s batching: 1 thread, beam 4, length penalty
0.2, Argos's settings; the output limit 256 tokens, Argos's). Argos's side runs in a child
process with its folders in a scratch directory and every network connection refused: it
installs the package, translates one line (loading the model), then the whole text in one
`argostranslate.translate.translate` call (1 thread, ARGOS_INTRA_THREADS=1). Both times are
decoding only, without start-up. Then the lines are compared, and the first few differences
printed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}

ARGOS = r"""
import json, socket, sys, time

def refuse(*args, **kwargs):
    raise OSError("no network: argostranslate tried to connect")

socket.socket.connect = refuse
socket.create_connection = refuse
import argostranslate.package
import argostranslate.translate

argostranslate.package.install_from_path(sys.argv[1])
(package,) = argostranslate.package.get_installed_packages()
lines = open(sys.argv[2], encoding="utf-8").read().split("\n")
translation = argostranslate.translate.get_translation_from_codes(package.from_code, package.to_code)
translation.translate(lines[0])  # loads the model
start = time.perf_counter()
output = argostranslate.translate.translate("\n".join(lines), package.from_code, package.to_code)
print(json.dumps({"seconds": time.perf_counter() - start, "lines": output.split("\n")}))
"""


def read_sentences(path: Path, limit: int) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(limit), f, strict=False)]


def timed_export(run: str, out: Path, fmt: str, quantization: str | None) -> float:
    command = [sys.executable, "-m", "mtrain", "export", f"run={run}", f"format={fmt}", f"out={out}"]
    if quantization:
        command.append(f"quantization={quantization}")
    start = time.perf_counter()
    done = subprocess.run(command, env=ENV, capture_output=True, timeout=1800)
    if done.returncode != 0:
        sys.exit(f"bench_argos: {' '.join(command)} failed:\n{done.stderr.decode(errors='replace')}")
    return time.perf_counter() - start


def size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run directory written by `mtrain fit`")
    data = Path(os.environ.get("MTRAIN_DATA_DIR", REPO_ROOT.parent / "shared" / "data"))
    parser.add_argument("--input", type=Path, default=data / "multi30k" / "test_2016_flickr.de.gz")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--quantization", default=None, help="as mtrain export's (e.g. int8); default float32")
    args = parser.parse_args()

    import torch

    from mtrain.config import DecodeConfig
    from mtrain.decode.engines.ct2_engine import load_ctranslate2
    from mtrain.decode.translation.translator import translate_sentences

    torch.set_num_threads(1)
    sentences = read_sentences(args.input, args.sentences)
    scratch = Path(tempfile.mkdtemp(prefix="bench_argos-"))
    package, ct2_dir = scratch / "model.argosmodel", scratch / "ct2"
    argos_export = timed_export(args.run, package, "argos", args.quantization)
    ct2_export = timed_export(args.run, ct2_dir, "ctranslate2", args.quantization)

    # Argos asks CTranslate2 for compute type `auto` (int8 on most CPUs, whatever the weights):
    # mtrain decodes at the same type, so the comparison is of the decoders, not of int8 and fp32.
    engine = load_ctranslate2(ct2_dir, torch.device("cpu"), "auto", 1, ct2_compute_type="auto")
    print(f"compute type: {engine.translator.compute_type} (CTranslate2's auto on this CPU, as Argos gets)")
    settings = DecodeConfig(beam=4, length_penalty=0.2, max_len_a=0.0, max_len_b=256)
    translate_sentences(engine, engine.tokenizer, sentences[:1], settings, "cpu")  # warm-up
    start = time.perf_counter()
    hypotheses = translate_sentences(engine, engine.tokenizer, sentences, settings, "cpu")
    mtrain_seconds = time.perf_counter() - start
    mine = [hyps[0].text for hyps in hypotheses]

    text = scratch / "input.txt"
    text.write_text("\n".join(sentences), encoding="utf-8")
    folders = {name: scratch / name for name in ("home", "data", "config", "cache", "packages")}
    env = {
        **ENV,
        "HOME": str(folders["home"]),
        "XDG_DATA_HOME": str(folders["data"]),
        "XDG_CONFIG_HOME": str(folders["config"]),
        "XDG_CACHE_HOME": str(folders["cache"]),
        "ARGOS_PACKAGES_DIR": str(folders["packages"]),
        "ARGOS_DEVICE_TYPE": "cpu",
        "ARGOS_INTRA_THREADS": "1",
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", ARGOS, str(package), str(text)], env=env, capture_output=True, timeout=3600
    )
    if done.returncode != 0:
        sys.exit(f"bench_argos: Argos failed:\n{done.stderr.decode(errors='replace')}")
    argos = json.loads(done.stdout.decode().splitlines()[-1])
    same = [i for i, (a, b) in enumerate(zip(argos["lines"], mine, strict=True)) if a == b]

    count = len(sentences)
    print(f"run: {args.run}; {count} sentences from {args.input}; weights {args.quantization or 'float32'}")
    print(f"| {'':28} | {'export s':>8} | {'size MB':>7} | {'sent/s':>7} |")
    print(f"|{'-' * 30}|{'-' * 10}|{'-' * 9}|{'-' * 9}|")
    print(
        f"| {'Argos Translate (package)':28} | {argos_export:8.1f} | {size_mb(package):7.1f} | "
        f"{count / argos['seconds']:7.1f} |"
    )
    print(
        f"| {'mtrain, engine=ctranslate2':28} | {ct2_export:8.1f} | {size_mb(ct2_dir):7.1f} | "
        f"{count / mtrain_seconds:7.1f} |"
    )
    print(f"identical lines: {len(same)}/{count}")
    for i in [i for i in range(count) if i not in set(same)][:5]:
        print(f"line {i + 1}: {sentences[i]!r}\n  argos:  {argos['lines'][i]!r}\n  mtrain: {mine[i]!r}")


if __name__ == "__main__":
    main()
