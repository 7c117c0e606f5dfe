"""Terminology constraints and target prefixes measured on a test set (docs/TRANSLATE.md figures).

    python scripts/oracle_terms.py --src test.de --ref test.en --hyp base.en ... --out terms.tsv
    python scripts/bench_constraints.py --run RUN --src test.de --ref test.en --terms terms.tsv

Loads the run once (engine=torch, fp32, 1 thread unless --threads) and decodes the test set:

1. plain beam search (the baseline), and with `terms=` (each source term found in a
   sentence, `mtrain.decode.requests.terminology`, makes its target term a constraint): term-use rate
   (of the (sentence, term) pairs the glossary finds, the share whose target term the output
   holds as a whole word, case-sensitive; and as a word start, `dog` in `dogs`, which is
   what a constraint's tokens `▁dog` guarantee), how often the reference holds it, BLEU and
   chrF (sacreBLEU defaults) and sentences/s (the best of `--repeats` timed decodes); with
   `--sentence-terms FILE` (scripts/oracle_terms.py --sentence-out) the same for each
   sentence's own oracle terms as unordered constraints;
2. with a target prefix, the first half (by whitespace words, rounded down) of each
   reference: BLEU of the continuation (the output after the prefix) against the
   reference's second half, beside the same part of the plain output (its words after as
   many words as the prefix had).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import sacrebleu
import torch

from mtrain.config import DecodeConfig, Engine
from mtrain.decode.requests.controls import encode_request, phrase_encoder
from mtrain.decode.requests.request import DecodeRequest
from mtrain.decode.requests.terminology import read_glossary
from mtrain.decode.translation.translator import translate_encoded
from mtrain.export.engine import open_engine


def used(term: str, output: str, whole_word: bool = True) -> bool:
    return re.search(r"(?<!\w)" + re.escape(term) + (r"(?!\w)" if whole_word else ""), output) is not None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", required=True)
    parser.add_argument("--src", required=True)
    parser.add_argument("--ref", required=True)
    parser.add_argument("--terms", required=True)
    parser.add_argument("--sentence-terms", help="per test line, its own target terms, tab-separated")
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", help="a directory for the outputs and a JSON of the figures")
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    device = torch.device("cpu")
    engine = open_engine(args.run, Engine.torch, device, "fp32", args.threads)
    tokenizer = engine.tokenizer_for(None)
    sources = Path(args.src).read_text(encoding="utf-8").splitlines()
    references = Path(args.ref).read_text(encoding="utf-8").splitlines()
    encoded = [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in sources]
    cfg = DecodeConfig(beam=args.beam)
    encode = phrase_encoder(tokenizer, engine.model)
    glossary = read_glossary(args.terms)
    wanted = [glossary.constraints(s) for s in sources]

    def decode(requests: list[DecodeRequest | None] | None) -> tuple[list[str], float]:
        controls = [encode_request(tokenizer, r, encode) for r in requests] if requests is not None else None
        best = float("inf")
        for _ in range(args.repeats):
            start = time.perf_counter()
            hyps = translate_encoded(engine.model, tokenizer, encoded, cfg, device, "fp32", controls=controls)
            best = min(best, time.perf_counter() - start)
        return [h[0].text for h in hyps], len(sources) / best

    def scores(outputs: list[str], refs: list[str]) -> dict[str, float]:
        return {
            "bleu": round(sacrebleu.corpus_bleu(outputs, [refs]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(outputs, [refs]).score, 2),
        }

    def term_use(outputs: list[str], terms_per_line: list[list[str]], whole_word: bool = True) -> float:
        pairs = [(term, out) for terms, out in zip(terms_per_line, outputs, strict=True) for term in terms]
        return round(100 * sum(used(term, out, whole_word) for term, out in pairs) / max(1, len(pairs)), 2)

    def terminology(outputs: list[str], speed: float, terms_per_line: list[list[str]]) -> dict[str, float]:
        return {
            **scores(outputs, references),
            "term_use": term_use(outputs, terms_per_line),
            "term_use_word_start": term_use(outputs, terms_per_line, whole_word=False),
            "sentences_per_s": round(speed, 1),
        }

    figures: dict[str, object] = {"sentences": len(sources), "beam": args.beam, "threads": args.threads}
    plain, plain_speed = decode(None)
    with_terms, terms_speed = decode(
        [DecodeRequest("", constraints=tuple(terms)) if terms else None for terms in wanted]
    )
    figures["terms"] = {
        "glossary_entries": len(glossary.targets),
        "sentences_with_terms": sum(bool(t) for t in wanted),
        "term_occurrences": sum(len(t) for t in wanted),
        "reference_term_use": term_use(references, wanted),
        "plain": terminology(plain, plain_speed, wanted),
        "terms": terminology(with_terms, terms_speed, wanted),
    }
    outputs = {"plain": plain, "terms": with_terms}
    if args.sentence_terms:
        own = [[t for t in line.split("\t") if t] for line in Path(args.sentence_terms).read_text("utf-8").splitlines()]
        constrained, own_speed = decode([DecodeRequest("", constraints=tuple(t)) if t else None for t in own])
        outputs["sentence_terms"] = constrained
        figures["sentence_terms"] = {
            "sentences_with_terms": sum(bool(t) for t in own),
            "term_occurrences": sum(len(t) for t in own),
            "reference_term_use": term_use(references, own),
            "plain": terminology(plain, plain_speed, own),
            "constrained": terminology(constrained, own_speed, own),
        }

    halves = [ref.split() for ref in references]
    prefixes = [" ".join(words[: len(words) // 2]) for words in halves]
    rests = [" ".join(words[len(words) // 2 :]) for words in halves]
    prefixed, prefix_speed = decode([DecodeRequest("", prefix=p) if p else None for p in prefixes])
    kept = [out.startswith(p) for out, p in zip(prefixed, prefixes, strict=True)]
    continuations = [out[len(p) :].strip() for out, p in zip(prefixed, prefixes, strict=True)]
    plain_rests = [
        " ".join(out.split()[len(p.split()) :]) for out, p in zip(plain, prefixes, strict=True)
    ]  # the same part of the plain output
    figures["prefix"] = {
        "outputs_starting_with_prefix": sum(kept),
        "continuation": scores(continuations, rests),
        "plain_same_part": scores(plain_rests, rests),
        "whole_output": scores(prefixed, references),
        "sentences_per_s": round(prefix_speed, 1),
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for name, lines in {**outputs, "prefix": prefixed}.items():
            (out / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        (out / "figures.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
