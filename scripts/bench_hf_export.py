"""`mtrain export format=hf` measured on a trained run: export time and size, tokenization and
translation parity with mtrain, and decoding speed of transformers' generate against mtrain's.

    python scripts/bench_hf_export.py --run runs/m30k --out /tmp/m30k_hf
    python scripts/bench_hf_export.py --run runs/m30k --sentences 200 --modes beam5

On the run's Multi30k test_2016_flickr sources (data/test.src of the run, else the corpus):
1. the export, timed, and the size of its files;
2. AutoTokenizer's ids against mtrain's `encode_src` + eos, sentence by sentence;
3. per mode (greedy, beam 5: the run's length penalty and length limits), mtrain (fp32, the
   KV-cached generator, its own token-budget batches) and `model.generate` (fp32, up to
   --batch sources of one length a call, so that `max_new_tokens` is each sentence's own
   mtrain limit) on the same sentences, in alternating chunks so that a change in the
   machine's load falls on both; sentences/s of each, and the outputs compared.

A translation that differs is classified:
- limit: the outputs reached the sentence's length limit, where mtrain forces EOS (with its
  log-probability: the beam's ranking changes) and transformers stops without one: the one
  convention the two do not share (greedy outputs are equal there: the same tokens);
- near-tie: mtrain's own model scores both outputs (teacher-forced, length-normalised as its
  beam search does) within --tie of each other: floating point decided, not the search;
- other: listed in full; there should be none.
Each difference is printed with its sentence number and the score gap.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from mtrain.checkpoint.files import load_run
from mtrain.config import DecodeConfig
from mtrain.decode.search.hypothesis import length_normalise
from mtrain.decode.translation.translator import translate_encoded
from mtrain.export import export_hf_run
from mtrain.export.hf_generation import max_new_tokens

MODES = {"greedy": 1, "beam5": 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True, help="a run directory of `mtrain fit`")
    parser.add_argument("--out", default=None, help="where to export (default: a temporary directory)")
    parser.add_argument("--sentences", type=int, default=None, help="the first N test sentences (default: all)")
    parser.add_argument("--modes", default="greedy,beam5")
    parser.add_argument("--batch", type=int, default=32, help="transformers' sentences per generate call")
    parser.add_argument("--chunks", type=int, default=4, help="alternating chunks per mode")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tie", type=float, default=1e-3, help="score gap below which outputs are near-ties")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import tempfile

    import transformers

    transformers.utils.logging.set_verbosity_error()
    out = Path(args.out or tempfile.mkdtemp(prefix="mtrain-hf-")) / "model"
    start = time.perf_counter()
    export_hf_run(Path(args.run), out, force=True)
    export_s = time.perf_counter() - start
    sizes = {path.name: path.stat().st_size for path in sorted(out.iterdir())}
    print(f"export: {export_s:.1f} s, {sum(sizes.values()) / 1e6:.1f} MB ({json.dumps(sizes)})")

    loaded = load_run(args.run)
    model, tokenizer, decode = loaded.model, loaded.tokenizer, loaded.config.decode
    max_positions = int(loaded.config.model.max_positions)
    hf_model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    hf_tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    sentences, references = test_sentences(Path(args.run), args.sentences)
    sources = [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in sentences]
    same_ids = sum(hf_tokenizer(s)["input_ids"] == ids for s, ids in zip(sentences, sources, strict=True))
    print(f"tokenization: {same_ids}/{len(sentences)} sources give mtrain's ids")
    figures: dict = {"export_s": export_s, "bytes": sizes, "tokenization_equal": same_ids, "sentences": len(sentences)}

    for mode in args.modes.split(","):
        cfg = DecodeConfig(
            beam=MODES[mode],
            length_penalty=decode.length_penalty,
            max_len_a=decode.max_len_a,
            max_len_b=decode.max_len_b,
            min_len=decode.min_len,
        )
        translate_encoded(model, tokenizer, sources[:8], cfg, "cpu")  # warm-up
        generate(hf_model, hf_tokenizer, sentences[:8], cfg, args.batch, max_positions)
        ours, theirs, seconds = [], [], {"mtrain": 0.0, "transformers": 0.0}
        size = -(-len(sentences) // args.chunks)
        for begin in range(0, len(sentences), size):
            start = time.perf_counter()
            ours += [
                h[0].tokens for h in translate_encoded(model, tokenizer, sources[begin : begin + size], cfg, "cpu")
            ]
            seconds["mtrain"] += time.perf_counter() - start
            start = time.perf_counter()
            theirs += generate(hf_model, hf_tokenizer, sentences[begin : begin + size], cfg, args.batch, max_positions)
            seconds["transformers"] += time.perf_counter() - start
        speed = {engine: len(sentences) / s for engine, s in seconds.items()}
        differences = classify(model, tokenizer, sources, ours, theirs, cfg, max_positions, args.tie)
        counts = {kind: sum(1 for d in differences if d["kind"] == kind) for kind in ("limit", "near-tie", "other")}
        equal = len(sentences) - len(differences)
        bleu = {
            name: corpus_bleu(tokenizer, outputs, references) for name, outputs in (("mtrain", ours), ("hf", theirs))
        }
        print(
            f"{mode}: {equal}/{len(sentences)} equal; differing: {counts}; sentences/s mtrain "
            f"{speed['mtrain']:.1f}, transformers {speed['transformers']:.1f} "
            f"(mtrain {speed['mtrain'] / speed['transformers']:.2f}x); BLEU mtrain {bleu['mtrain']:.2f}, "
            f"transformers {bleu['hf']:.2f}"
        )
        for difference in differences:
            print(f"  {mode} sentence {difference['sentence']}: {difference['kind']} ({difference['why']})")
        figures[mode] = {"equal": equal, "differing": counts, "sentences_per_s": speed, "bleu": bleu}
        figures[mode]["differences"] = differences
    figures["cpu"] = cpu_name()
    figures["threads"] = args.threads
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


def test_sentences(run: Path, count: int | None) -> tuple[list[str], list[str]]:
    """The run's test sources and references (data/test.src, data/test.ref)."""
    data = run / "data"
    sources = (data / "test.src").read_text(encoding="utf-8").splitlines()
    references = (data / "test.ref").read_text(encoding="utf-8").splitlines()
    return sources[:count], references[:count]


def generate(hf_model, hf_tokenizer, sentences: list[str], cfg: DecodeConfig, batch: int, max_positions: int):
    """transformers' outputs (ids without bos and eos) in input order. Sources of one length
    go together, up to `batch` a call: no padding, and one `max_new_tokens` that is each
    sentence's own mtrain limit (it depends only on the source's length)."""
    encoded = [hf_tokenizer(sentence)["input_ids"] for sentence in sentences]
    by_length: dict[int, list[int]] = {}
    for index, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(index)
    outputs: list[list[int]] = [[] for _ in sentences]
    eos = hf_tokenizer.eos_token_id
    for length, indices in sorted(by_length.items(), reverse=True):
        limit = max_new_tokens(length, cfg.max_len_a, cfg.max_len_b, max_positions)
        for begin in range(0, len(indices), batch):
            group = indices[begin : begin + batch]
            input_ids = torch.tensor([encoded[i] for i in group])
            with torch.inference_mode():
                generated = hf_model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    num_beams=cfg.beam,
                    length_penalty=cfg.length_penalty,
                    max_new_tokens=limit,
                )
            for i, row in zip(group, generated[:, 1:].tolist(), strict=True):
                outputs[i] = row[: row.index(eos)] if eos in row else row
    return outputs


def classify(model, tokenizer, sources, ours, theirs, cfg: DecodeConfig, max_positions: int, tie: float) -> list:
    """Each differing output: its sentence, kind (limit | near-tie | other) and why."""
    differences = []
    for index, (source, mine, hers) in enumerate(zip(sources, ours, theirs, strict=True)):
        if mine == hers:
            continue
        limit = max_new_tokens(len(source), cfg.max_len_a, cfg.max_len_b, max_positions)
        if limit in (len(mine), len(hers)):
            differences.append(
                {"sentence": index, "kind": "limit", "why": f"limit {limit}, lengths {len(mine)} / {len(hers)}"}
            )
            continue
        if cfg.beam == 1:  # where the greedy paths part, how far apart were the two tokens?
            step = next(i for i, (a, b) in enumerate(zip([*mine, -1], [*hers, -1], strict=False)) if a != b)
            lprobs = step_log_probs(model, tokenizer, source, mine[:step])
            chosen = [t if t >= 0 else tokenizer.eos_id for t in ([*mine, -1][step], [*hers, -1][step])]
            gap = abs(float(lprobs[chosen[0]] - lprobs[chosen[1]]))
        else:
            gap = abs(score(model, tokenizer, source, mine, cfg) - score(model, tokenizer, source, hers, cfg))
        kind = "near-tie" if gap <= tie else "other"
        differences.append({"sentence": index, "kind": kind, "why": f"mtrain's scores {gap:.2e} apart"})
    return differences


def step_log_probs(model, tokenizer, source: list[int], prefix: list[int]) -> torch.Tensor:
    src = torch.tensor([source])
    with torch.inference_mode():
        logits = model(src, src.eq(tokenizer.pad_id), torch.tensor([[tokenizer.bos_id, *prefix]]))
    return torch.log_softmax(logits[0, -1].float(), dim=-1)


def score(model, tokenizer, source: list[int], output: list[int], cfg: DecodeConfig) -> float:
    """mtrain's beam score of `output` + EOS: its log-probability / (length incl. EOS) ** alpha."""
    src = torch.tensor([source])
    labels = torch.tensor([*output, tokenizer.eos_id])
    with torch.inference_mode():
        logits = model(src, src.eq(tokenizer.pad_id), torch.tensor([[tokenizer.bos_id, *output]]))
    log_prob = torch.log_softmax(logits[0].float(), dim=-1)[torch.arange(len(labels)), labels].sum()
    return float(length_normalise(log_prob, len(labels), cfg.length_penalty))


def corpus_bleu(tokenizer, outputs: list[list[int]], references: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu([tokenizer.decode_tgt(ids) for ids in outputs], [references]).score


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


if __name__ == "__main__":
    main()
