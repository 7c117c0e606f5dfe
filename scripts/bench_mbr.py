"""MBR decoding and reranking against beam 5: BLEU, chrF, TER, paired bootstrap, sentences/s.

    python scripts/bench_mbr.py --run RUN --out DIR --mbr sample:16 beam:16 sample:32 \\
        --system rerank:decode.rerank.reverse_run=REV,decode.rerank.weights=w.json
    python scripts/bench_mbr.py --run EXPORT_DIR --engine ctranslate2 --precision int8 --mbr sample:16 \\
        --base-decode decode.sampling=topp                   # CTranslate2 has no epsilon sampling
    python scripts/bench_mbr.py ... --limit 250               # the first 250 sentences of the split

Every system decodes the run's test split (`--split`) with the code `mtrain eval` runs:
- `beam5`: the defaults (beam 5, alpha 1), always, the baseline;
- `--mbr KIND:N`: two systems, MBR-chrF and MBR-BLEU over the same candidates: they are drawn
  once (`mtrain.decode.selection.mbr.draw_candidates`, in the translator's batches and seed, so they are
  those either `decode.mbr.utility` would draw) and ranked by each utility; a system's time
  is the drawing plus its own ranking;
- `--system NAME:KEY=VALUE,...`: `translate_sentences` with those decode keys (reranking, combinations).
Hypotheses go to DIR/NAME.hyp, figures to DIR/results.json; sacreBLEU's paired bootstrap
(1,000 resamples, `sacrebleu REF -i beam5.hyp ... --paired-bs`) to DIR/paired_bs.txt.
One thread unless --num-threads says otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))


def decode_config(overrides: list[str]):
    from mtrain.config import DecodeConfig, TranslateConfig
    from mtrain.config_checks import check_config

    node = OmegaConf.merge(OmegaConf.structured(TranslateConfig), OmegaConf.from_dotlist(overrides))
    check_config(node)
    cfg: DecodeConfig = OmegaConf.to_object(node).decode
    return cfg


def main() -> None:
    from mtrain.cli.evaluate import exported_model
    from mtrain.config import Engine, MbrCandidates, MbrConfig, MbrUtility, with_values
    from mtrain.decode.engines.threads import set_decode_threads
    from mtrain.decode.selection.mbr import draw_candidates, rank_by_expected_utility
    from mtrain.decode.selection.selecting import decoded_per_sentence
    from mtrain.decode.translation.translator import as_engine, token_budget_batches, translate_sentences
    from mtrain.evaluate.references import read_run_split
    from mtrain.evaluate.runs import run_config
    from mtrain.export.engine import open_engine
    from mtrain.rundir import RunDir, is_export_dir

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--split", default="test")
    parser.add_argument("--engine", default="torch")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--num-threads", type=int, default=1)
    parser.add_argument("--limit", type=int, default=0, help="the first N sentences only")
    parser.add_argument("--mbr", nargs="*", default=[], help="KIND:N (beam|sample|both)")
    parser.add_argument("--system", nargs="*", default=[], help="NAME:decode.key=value,...")
    parser.add_argument("--base-decode", nargs="*", default=[], help="decode.key=value for every MBR system")
    args = parser.parse_args()

    threads = set_decode_threads(args.num_threads)
    device = torch.device("cpu")
    opened = open_engine(args.run, Engine(args.engine), device, args.precision, threads)
    if is_export_dir(args.run):  # the split of the run it was exported from, as `mtrain eval` reads it
        data_cfg, split_run, _ = exported_model(RunDir(args.run), opened.model.metadata)
    else:
        data_cfg, split_run = run_config(Path(args.run)).data, RunDir(args.run)
    split = read_run_split(split_run, data_cfg, args.split)
    sources, refs = split.sources, split.references[0]
    if args.limit:
        sources, refs = sources[: args.limit], refs[: args.limit]
    tokenizer = opened.tokenizer
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ref.txt").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    results: dict[str, dict] = {}

    def record(name: str, hyps: list[str], seconds: float, cpu_seconds: float, settings: dict) -> None:
        (args.out / f"{name}.hyp").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        results[name] = {
            "seconds": round(seconds, 2),
            "sentences_per_s": round(len(hyps) / seconds, 2),
            # A shared machine's wall clock counts the others' work too: CPU seconds do not.
            "sentences_per_cpu_s": round(len(hyps) / cpu_seconds, 2),
            "precision": opened.precision,
            **settings,
        }
        print(
            f"{name}: {len(hyps) / seconds:.2f} sentences/s, {len(hyps) / cpu_seconds:.2f} per CPU-second", flush=True
        )
        (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")

    systems = [("beam5", [])] + [
        (spec.split(":", 1)[0], spec.split(":", 1)[1].split(",") if ":" in spec else []) for spec in args.system
    ]
    for name, overrides in systems:
        cfg = decode_config(overrides)
        start, cpu = time.perf_counter(), time.process_time()
        nbest = translate_sentences(opened.model, tokenizer, sources, cfg, device, opened.precision)
        record(
            name,
            [h[0].text for h in nbest],
            time.perf_counter() - start,
            time.process_time() - cpu,
            {"decode": overrides},
        )

    engine = as_engine(opened.model, tokenizer, device, opened.precision)
    encoded = [tokenizer.encode_src(s) + [tokenizer.eos_id] if s.strip() else None for s in sources]
    for spec in args.mbr:
        kind, count = spec.split(":")
        cfg = decode_config(args.base_decode)
        cfg = with_values(cfg, mbr=MbrConfig(candidates=MbrCandidates(kind), num_candidates=int(count)))
        to_decode = [i for i, ids in enumerate(encoded) if ids]
        drawn: dict[int, tuple] = {}
        start, cpu = time.perf_counter(), time.process_time()
        lengths = [len(encoded[i] or ()) for i in to_decode]
        for batch in token_budget_batches(lengths, max(1, cfg.max_tokens // decoded_per_sentence(cfg))):
            indices = [to_decode[j] for j in batch]
            candidates, references = draw_candidates(engine, tokenizer, [encoded[i] or () for i in indices], cfg)
            for i, c, r in zip(indices, candidates, references, strict=True):
                drawn[i] = (c, r)
        drawing, drawing_cpu = time.perf_counter() - start, time.process_time() - cpu
        distinct = sum(len(drawn[i][0]) for i in drawn) / max(1, len(drawn))
        for utility in (MbrUtility.chrf, MbrUtility.bleu):
            start, cpu = time.perf_counter(), time.process_time()
            hyps = [
                rank_by_expected_utility(drawn[i][0], drawn[i][1], utility)[0].text if i in drawn else ""
                for i in range(len(sources))
            ]
            ranking, ranking_cpu = time.perf_counter() - start, time.process_time() - cpu
            record(
                f"mbr_{utility.value}_{kind}{count}",
                hyps,
                drawing + ranking,
                drawing_cpu + ranking_cpu,
                {
                    "decode": [
                        *args.base_decode,
                        f"decode.mbr.candidates={kind}",
                        f"decode.mbr.num_candidates={count}",
                        f"decode.mbr.utility={utility.value}",
                    ],
                    "drawing_s": round(drawing, 2),
                    "ranking_s": round(ranking, 2),
                    "distinct_candidates": round(distinct, 1),
                },
            )

    names = [name for name in results if name != "beam5"]
    if names:
        command = [
            sys.executable, "-m", "sacrebleu", str(args.out / "ref.txt"), "-i", str(args.out / "beam5.hyp"),
            *(str(args.out / f"{name}.hyp") for name in names), "-m", "bleu", "chrf", "ter", "--paired-bs", "-w", "2", "-f", "text",
        ]  # fmt: skip
        table = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        (args.out / "paired_bs.txt").write_text(table, encoding="utf-8")
        print(table)


if __name__ == "__main__":
    main()
