"""Decoding speed: sentences/s and target tokens/s on Multi30k test_2016_flickr.

    python scripts/bench_decode.py --run outputs/DATE/TIME            # a trained run (meaningful)
    python scripts/bench_decode.py --sentences 200                     # random model, quick
    python scripts/bench_decode.py --modes beam5 --precisions fp32 --cache on,off

Measures greedy and beam-5 decoding with the KV cache (`model.decode_step`) and without it
(the whole prefix recomputed by `model.forward` every step), in fp32 and bf16 autocast, on
the CPU and on a GPU when there is one. Each setting decodes the same sentences through
`mtrain.decode.translate_encoded` after one warm-up batch; target tokens are the best
hypotheses' tokens plus EOS. With a run, BLEU against the references is printed too, so
a faster setting can be checked to translate as well.

Without --run, a randomly initialised model of the benchmark size (3+3 layers, d_model
256, 4 heads, FFN 1024, 8k joint SentencePiece vocabulary trained on Multi30k and cached)
is used. A random model never prefers EOS, so every hypothesis runs to max length
(1.5 * src_len + 10): that is the costliest case per sentence and exaggerates what the
cache saves; tokens/s stays comparable, sentences/s does not. Measure a trained run.
With ctranslate2 installed, the same model is converted (`mtrain.export`) and decoded by
CTranslate2 on the CPU in float32 and int8 (`--ct2`) through `mtrain.decode.engines.ct2_engine`
(mtrain's length and stopping semantics), with as many threads as torch; a last line per
mode gives CTranslate2's speed over mtrain's fastest cached setting, and how many outputs
CTranslate2 float32 shares with mtrain fp32.
The CPU is shared: use --sentences to keep runs short while developing, and --threads 1
when other jobs load the cores (with 2 threads on 2 busy cores, decoding ran 7-13x slower
than with 1: the threads wait for each other).

Measured on this project's CPU (AMD EPYC, AVX512-BF16, no AMX; 1 thread, shared machine)
with a 3+3 layer d_model 256 run trained 12 minutes (test BLEU 28.8, beam 5):
1,000 sentences, KV cache: greedy 149 sent/s fp32, 252 bf16; beam 5 34 sent/s fp32,
54 bf16 (BLEU 27.9/28.0 greedy, 28.7/28.8 beam 5). First 100 sentences, fp32, cache vs
recomputation: greedy 66 vs 7.2 sent/s (9x), beam 5 24.8 vs 1.4 sent/s (18x).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from mtrain.config import DecodeConfig, ModelConfig
from mtrain.decode.translation.translator import translate_encoded

MODES = {"greedy": 1, "beam5": 5}
BENCH_MODEL = ModelConfig(encoder_layers=3, decoder_layers=3, d_model=256, heads=4, ffn_dim=1024, dropout=0.0)


def data_dir() -> Path:
    return Path(os.environ.get("MTRAIN_DATA_DIR", REPO_ROOT.parent / "shared" / "data")) / "multi30k"


def read_lines(path: Path, limit: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [line.rstrip("\n") for _, line in zip(range(limit), f, strict=False)]


def benchmark_tokenizer(cache: Path):
    """An 8k joint SentencePiece model of Multi30k de+en, trained once and cached."""
    import sentencepiece as spm

    from mtrain.tokenizer import Tokenizer

    model_file = cache / "spm.model"
    if not model_file.exists():
        cache.mkdir(parents=True, exist_ok=True)
        text = cache / "train.txt"
        with text.open("w", encoding="utf-8") as out:
            for lang in ("de", "en"):
                out.writelines(line + "\n" for line in read_lines(data_dir() / f"train.{lang}.gz", 10**9))
        with open(os.devnull, "w") as quiet:
            spm.SentencePieceTrainer.train(
                input=str(text),
                model_prefix=str(cache / "spm"),
                vocab_size=8000,
                unk_id=0,
                pad_id=1,
                bos_id=2,
                eos_id=3,
                logstream=quiet,
            )
        text.unlink()
    return Tokenizer({"spm.model": model_file})


def load(args, device: torch.device):
    if args.run:
        from mtrain.checkpoint.files import load_run

        loaded = load_run(args.run, which=args.checkpoint, device=device)
        return loaded.model, loaded.tokenizer, f"{args.run} ({loaded.checkpoint_path.name})"
    from mtrain.model import build_model

    tokenizer = benchmark_tokenizer(Path(args.tokenizer_cache).expanduser())
    torch.manual_seed(0)
    model = build_model(
        BENCH_MODEL, tokenizer.src_vocab_size, tokenizer.tgt_vocab_size, tokenizer.pad_id, joint_vocab=tokenizer.joint
    )
    return model.to(device).eval(), tokenizer, "random benchmark-size model (outputs run to max length)"


def load_ctranslate2(args, model, tokenizer, compute_type: str):
    """The same weights converted to CTranslate2 (mtrain.export), decoding with mtrain's
    semantics (mtrain.decode.engines.ct2_engine); `compute_type` float32 or int8 (quantized on load)."""
    import tempfile

    from mtrain.decode.engines.ct2_engine import load_ctranslate2 as load_exported
    from mtrain.export import export_ctranslate2

    model_cfg = BENCH_MODEL
    if args.run:
        from mtrain.checkpoint.files import load_run

        model_cfg = load_run(args.run, which=args.checkpoint).config.model
    precision = {"float32": "fp32", "int8": "int8"}[compute_type]
    with tempfile.TemporaryDirectory() as scratch:
        directory = export_ctranslate2(model.state_dict(), model_cfg, tokenizer, Path(scratch) / "ct2")
        return load_exported(directory, torch.device("cpu"), precision, torch.get_num_threads(), tokenizer)


def bleu(hyps: list[str], refs: list[str]) -> float:
    import sacrebleu

    return sacrebleu.corpus_bleu(hyps, [refs]).score


def measure(model, tokenizer, sources, refs, beam, use_cache, precision, device, max_tokens, repeat) -> dict:
    """Decode `sources` `repeat` times; the fastest run counts (others' load only slows runs down)."""
    cfg = DecodeConfig(beam=beam, nbest=1, max_tokens=max_tokens)
    translate_encoded(model, tokenizer, sources[:8], cfg, device, precision, use_cache=use_cache)  # warm-up
    seconds = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        hyps = translate_encoded(model, tokenizer, sources, cfg, device, precision, use_cache=use_cache)
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = min(seconds, time.perf_counter() - start)
    tokens = sum(len(h[0].tokens) + 1 for h in hyps)
    result = {
        "outputs": [h[0].tokens for h in hyps],
        "sentences": len(sources),
        "seconds": round(seconds, 2),
        "sentences_per_s": round(len(sources) / seconds, 1),
        "tokens_per_s": round(tokens / seconds, 1),
        "mean_output_tokens": round(tokens / len(sources), 1),
    }
    if refs is not None:
        result["bleu"] = round(bleu([h[0].text for h in hyps], refs), 2)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="a run directory of `mtrain fit` (default: random benchmark-size model)")
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument("--sentences", type=int, default=1000, help="first N sentences of test_2016_flickr")
    parser.add_argument("--modes", default="greedy,beam5")
    parser.add_argument("--cache", default="on,off", help="on, off or on,off")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--devices", default="cpu,cuda", help="cuda is skipped when there is none")
    parser.add_argument(
        "--ct2",
        default="float32,int8",
        help="CTranslate2 compute types on the CPU, same model and sentences ('' to skip)",
    )
    parser.add_argument("--max-tokens", type=int, default=DecodeConfig.max_tokens, help="source tokens per batch")
    parser.add_argument("--repeat", type=int, default=1, help="runs per setting; the fastest counts")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--tokenizer-cache", default="~/.cache/mtrain/bench_decode_spm8k")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    src = read_lines(data_dir() / "test_2016_flickr.de.gz", args.sentences)
    refs = read_lines(data_dir() / "test_2016_flickr.en.gz", args.sentences) if args.run else None
    results = []
    for device_name in args.devices.split(","):
        if device_name == "cuda" and not torch.cuda.is_available():
            continue
        device = torch.device(device_name)
        model, tokenizer, description = load(args, device)
        sources = [tokenizer.encode_src(s) + [tokenizer.eos_id] for s in src]
        print(f"# {description} on {device} ({torch.get_num_threads()} threads), {len(src)} sentences", flush=True)
        print("| device | engine | mode | cache | precision | sent/s | tgt tok/s | s | mean out len | BLEU |")
        print("|---|---|---|---|---|---:|---:|---:|---:|---:|", flush=True)
        engines = [("torch", model, precision) for precision in args.precisions.split(",")]
        if device.type == "cpu" and args.ct2:
            engines += [
                ("ctranslate2", load_ctranslate2(args, model, tokenizer, compute_type), compute_type)
                for compute_type in args.ct2.split(",")
            ]
        for mode in args.modes.split(","):
            for engine, engine_model, precision in engines:
                for cache in args.cache.split(",") if engine == "torch" else ["on"]:
                    r = measure(
                        engine_model,
                        tokenizer,
                        sources,
                        refs,
                        MODES[mode],
                        cache == "on",
                        precision,
                        device,
                        args.max_tokens,
                        args.repeat,
                    )
                    r.update(device=device_name, engine=engine, mode=mode, cache=cache, precision=precision)
                    results.append(r)
                    print(
                        f"| {device_name} | {engine} | {mode} | {cache} | {precision} | {r['sentences_per_s']} | "
                        f"{r['tokens_per_s']} | {r['seconds']} | {r['mean_output_tokens']} | {r.get('bleu', '-')} |",
                        flush=True,
                    )
    print_ctranslate2_comparison(results)
    for r in results:
        r.pop("outputs")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


def print_ctranslate2_comparison(results: list[dict]) -> None:
    """Per mode: CTranslate2's speed over mtrain's fastest cached CPU setting, and how many
    outputs CTranslate2 fp32 shares with mtrain's fp32 cached decoder."""
    for mode in dict.fromkeys(r["mode"] for r in results):
        row = {
            (r["engine"], r["precision"]): r
            for r in results
            if r["mode"] == mode and r["device"] == "cpu" and r["cache"] == "on"
        }
        mtrain_rows = [r for (engine, _), r in row.items() if engine == "torch"]
        ct2_rows = [r for (engine, _), r in row.items() if engine == "ctranslate2"]
        if not mtrain_rows or not ct2_rows:
            continue
        fastest = max(mtrain_rows, key=lambda r: r["tokens_per_s"])
        ratios = ", ".join(f"{r['precision']} {r['tokens_per_s'] / fastest['tokens_per_s']:.2f}x" for r in ct2_rows)
        line = f"{mode}: CTranslate2 / mtrain {fastest['precision']} (cached) tokens/s: {ratios}"
        if ("torch", "fp32") in row and ("ctranslate2", "float32") in row:
            pairs = zip(row["torch", "fp32"]["outputs"], row["ctranslate2", "float32"]["outputs"], strict=True)
            same = sum(a == b for a, b in pairs)
            line += (
                f"; CTranslate2 float32 output = mtrain fp32 on {same}/{len(row['torch', 'fp32']['outputs'])} sentences"
            )
        print(line, flush=True)


if __name__ == "__main__":
    main()
