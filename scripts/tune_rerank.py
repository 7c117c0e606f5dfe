"""Tune n-best reranking weights on a run's validation set; write the weights file.

    python scripts/tune_rerank.py run=RUN decode.rerank.reverse_run=REVERSE_RUN out=weights.json
    python scripts/tune_rerank.py run=RUN decode.rerank.reverse_run=REV decode.mbr.candidates=sample \\
        decode.mbr.num_candidates=32 out=weights_mbr.json           # rerank MBR's candidates
    mtrain eval run=RUN split=test decode.rerank.reverse_run=REV decode.rerank.weights=weights.json out=DIR

Decodes `split` (valid unless given) with the `decode.*` settings given (the whole beam, or
MBR's candidates), computes every feature this decode has (mtrain.decode.rerank: forward,
length_ratio; reverse with decode.rerank.reverse_run, second with decode.rerank.second_run,
mbr with decode.mbr.candidates), and searches the weights that maximise corpus BLEU of the
reranked first-best (`tune_weights`: seeded random search, `trials` of them; the same inputs
and seed give the same weights). The file names its features, so a decode with other
settings refuses it. Keys: run, out, split, trials, seed, limit (the first N sentences),
num_threads, device, precision, and any decode.* key. Refusals are one line on stderr, exit status 2.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from omegaconf import OmegaConf

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

SCRIPT_KEYS = {
    "run": None,
    "out": None,
    "split": "valid",
    "trials": 200,
    "seed": 1,
    "limit": 0,
    "num_threads": 1,
    "device": "cpu",
    "precision": "auto",
}


def main(argv: list[str]) -> int:
    from mtrain.config import DecodeConfig, RerankConfig, with_values
    from mtrain.config_checks import check_config
    from mtrain.decode.rerank import FeatureScorer, check_rerank_files, tune_weights, write_weights
    from mtrain.decode.threads import set_decode_threads
    from mtrain.decode.translator import translate_sentences
    from mtrain.errors import MtrainError
    from mtrain.evaluate.references import read_run_split
    from mtrain.export.engine import open_engine
    from mtrain.rundir import RunDir
    from mtrain.runtime import resolve_device

    try:
        given = OmegaConf.from_dotlist(argv)
        unknown = [key for key in given if key not in SCRIPT_KEYS and key != "decode"]
        if unknown:
            raise MtrainError(f"{unknown[0]}: unknown key (keys: {', '.join(SCRIPT_KEYS)}, decode.*)")
        settings = {**SCRIPT_KEYS, **{key: given[key] for key in given if key != "decode"}}
        if not settings["run"] or not settings["out"]:
            raise MtrainError("run=RUN_DIR and out=WEIGHTS.json are needed")
        from mtrain.config import TranslateConfig

        full = OmegaConf.merge(
            OmegaConf.structured(TranslateConfig), {"run": settings["run"], "decode": given.get("decode", {})}
        )
        check_config(full)
        cfg: DecodeConfig = OmegaConf.to_object(full).decode  # type: ignore[union-attr]
        check_rerank_files(cfg, settings["run"], tuning=True)
        set_decode_threads(int(settings["num_threads"]))
        device = resolve_device(str(settings["device"]))
        engine = open_engine(
            settings["run"], full.engine, device, str(settings["precision"]), int(settings["num_threads"])
        )
        assert engine.loaded is not None
        split = read_run_split(RunDir(settings["run"]), engine.loaded.config.data, str(settings["split"]))
        sources, references = split.sources, split.references[0]
        if int(settings["limit"]) > 0:
            sources, references = sources[: int(settings["limit"])], references[: int(settings["limit"])]
        plain = with_values(cfg, rerank=RerankConfig(), nbest=cfg.mbr.num_candidates if cfg.uses_mbr else cfg.beam)
        start = time.perf_counter()
        nbest = translate_sentences(engine.model, engine.tokenizer, sources, plain, device, engine.precision)
        decoded = time.perf_counter() - start
        scorer = FeatureScorer(cfg, device)
        encoded = [engine.tokenizer.encode_src(s) + [engine.tokenizer.eos_id] for s in sources]
        start = time.perf_counter()
        features = scorer(engine.tokenizer, encoded, nbest)
        scored = time.perf_counter() - start
        texts = [[hyp.text for hyp in hyps] for hyps in nbest]
        weights, bleu = tune_weights(
            features, texts, references, scorer.features, int(settings["trials"]), int(settings["seed"])
        )
        first_bleu = tune_weights(features, texts, references, scorer.features, 1)[1]
        weights.record.update(
            run=str(settings["run"]),
            split=str(settings["split"]),
            decode=OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True),
            bleu_before=first_bleu,
            seconds={"decode": round(decoded, 1), "features": round(scored, 1)},
        )
        write_weights(settings["out"], weights)
    except MtrainError as error:
        print(f"tune_rerank: {error}", file=sys.stderr)
        return 2
    print(
        f"{settings['split']} BLEU {first_bleu:.2f} (decoded order) -> {bleu:.2f} reranked; weights "
        + ", ".join(f"{name}={w:.3f}" for name, w in zip(weights.features, weights.weights, strict=True))
        + f"; written to {settings['out']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
