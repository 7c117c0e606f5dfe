"""Per-sentence oracle terms (the WMT 2021 terminology task's oracle setting): every test sentence
decoded with its own terms, as a request's `terms` (mtrain serve's JSON API) gives them, once per
decoding mode, and scored: BLEU and chrF (sacreBLEU), and the WMT21 terminology metrics over each
sentence's own terms (mtrain/evaluate/terminology.py, summed over sentences).

    python scripts/oracle_terms.py --src test.de.gz --ref test.en.gz --hyp baseline.en \\
        --train-src train.de.gz --train-tgt train.en.gz --out oracle.tsv --sentence-pairs-out pairs.tsv
    python scripts/bench_sentence_terms.py --run runs/m30k --src test.de.gz --ref test.en.gz --pairs pairs.tsv \\
        [--modes "no terms,constraints + placement"] [--beam 5]

Modes as scripts/bench_terms.py names them (the annotation rows need a term-aware run). Window
overlap is the mean over the sentences that have one; 1-TERm the mean over all sentences. The
sentences go through mtrain's request pipeline one by one (each with its own glossary), so the
speed column is one sentence at a time, comparable between the rows of one run only.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import sacrebleu
import torch

from mtrain.config import DecodeConfig, ServeConfig
from mtrain.decode.requests.pipeline import Options
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.requests.terminology import Glossary
from mtrain.evaluate.metrics import read_lines
from mtrain.evaluate.terminology import score_terms
from mtrain.runtime import set_threads
from mtrain.serve.model import open_served_model

MODES = {
    "no terms": None,
    "constraints": {"term_mode": "constraints", "term_placement": "none"},
    "constraints + placement": {"term_mode": "constraints", "term_placement": "aligned"},
    "annotation": {"term_mode": "annotation"},
    "annotation + constraints": {"term_mode": "both", "term_placement": "none"},
    "annotation + constraints + placement": {"term_mode": "both", "term_placement": "aligned"},
}


def sentence_glossaries(path: str) -> list[dict[str, str]]:
    out = []
    for line in read_lines(path):
        fields = line.split("\t") if line else []
        out.append(dict(zip(fields[0::2], fields[1::2], strict=True)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--pairs", required=True, help="scripts/oracle_terms.py --sentence-pairs-out")
    parser.add_argument("--modes", default="no terms,constraints,constraints + placement")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--limit", type=int, help="the first N sentences only")
    args = parser.parse_args()

    set_threads(args.threads)
    sources, references = read_lines(args.src), read_lines(args.ref)
    glossaries = sentence_glossaries(args.pairs)
    if args.limit:
        sources, references, glossaries = sources[: args.limit], references[: args.limit], glossaries[: args.limit]
    served = open_served_model(
        ServeConfig(run=args.run, device="cpu", precision="fp32", decode=DecodeConfig(beam=args.beam)),
        torch.device("cpu"),
        args.threads,
    )
    pipeline = served.pipeline()
    print("| decoding | term acc. | window 2 | window 3 | 1-TERm | BLEU | chrF | sent/s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.modes.split(","):
        settings = MODES[name]
        decode = DecodeConfig(beam=args.beam, **(settings or {}))
        hypotheses = []
        started = time.perf_counter()
        for source, terms in zip(sources, glossaries, strict=True):
            glossary = Glossary.of(terms) if settings is not None and terms else None
            hyps = pipeline.translate([DecodeRequest(source, where="test")], Options(decode=decode, glossary=glossary))
            hypotheses.append(hyps[0][0].text if hyps[0] else "")
        seconds = time.perf_counter() - started
        found = instances = 0
        windows = {2: [], 3: []}
        one_minus = []
        for source, hypothesis, reference, terms in zip(sources, hypotheses, references, glossaries, strict=True):
            scores = score_terms(Glossary.of(terms), [source], [hypothesis], [reference])
            one_minus.append(scores.one_minus_term)
            if scores.instances:
                instances += scores.instances
                found += round(scores.exact_match * scores.instances)
                for size in windows:
                    windows[size].append(scores.window_overlap[size])
        bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
        chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
        print(
            f"| {name} | {100 * found / max(instances, 1):.1f} | {100 * sum(windows[2]) / max(len(windows[2]), 1):.1f} | "
            f"{100 * sum(windows[3]) / max(len(windows[3]), 1):.1f} | {100 * sum(one_minus) / len(one_minus):.1f} | "
            f"{bleu:.2f} | {chrf:.2f} | {len(sources) / seconds:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
