"""Tune n-best reranking weights on a run's validation set; write the weights file.

    python scripts/tune_rerank.py run=RUN decode.rerank.reverse_run=REVERSE_RUN out=weights.json
    python scripts/tune_rerank.py run=RUN decode=mbr_chrf decode.rerank.reverse_run=REV \\
        out=weights_mbr.json           # rerank MBR's candidates (a decode preset, as translate's)
    mtrain eval run=RUN split=test decode.rerank.reverse_run=REV decode.rerank.weights=weights.json out=DIR

Decodes `split` (valid unless given) with the `decode.*` settings given (the whole beam, or
MBR's candidates), computes every feature this decode has (mtrain.decode.selection.rerank: forward,
length_ratio; reverse with decode.rerank.reverse_run, second with decode.rerank.second_run,
mbr with decode.mbr.candidates), and searches the weights that maximise corpus BLEU of the
reranked first-best (`tune_weights`: seeded random search, `trials` of them; the same inputs
and seed give the same weights). The file names its features, so a decode with other
settings refuses it. Keys: run, out, split, trials, seed, limit (the first N sentences),
num_threads, device, precision, progress_every (seconds), a decode preset (decode=mbr_chrf: the
keys of configs/decode/mbr_chrf.yaml) and any decode.* key. Refusals are one line on stderr,
exit status 2.

It says what it does on stderr as it goes (`tune_rerank: ...`): each stage as it starts, the
decode's progress every `progress_every` seconds (30), the scoring's every eighth of the
sentences, the search's every quarter of the trials.
Its time goes to the decode of the split with the whole beam (or MBR's candidates), to scoring
every hypothesis with the other runs, and to the search (one corpus BLEU a trial); how long on
Multi30k: docs/TRANSLATE.md, "The best-quality recipe".
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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
    "progress_every": 30,
}
HELP_FLAGS = ("-h", "--help")


def say(line: str) -> None:
    """A progress line: on stderr, so that stdout keeps only the result line."""
    print(f"tune_rerank: {line}", file=sys.stderr, flush=True)


def counting_bleu(
    trials: int, clock: Callable[[], float] = time.perf_counter
) -> Callable[[list[str], list[str]], float]:
    """sacreBLEU's corpus BLEU for `tune_weights`, saying every quarter of the trials how far
    the search is (one call per trial)."""
    import sacrebleu

    calls, start = [0], clock()
    marks = {max(1, round(trials * quarter / 4)) for quarter in (1, 2, 3)} - {trials}

    def score(hypotheses: list[str], references: list[str]) -> float:
        calls[0] += 1
        if calls[0] in marks:
            say(f"searched {calls[0]}/{trials} weight trials ({clock() - start:.1f} s)")
        return float(sacrebleu.corpus_bleu(hypotheses, [references]).score)

    return score


def decode_preset(name: str) -> Any:
    """configs/decode/NAME.yaml, as `mtrain translate decode=NAME` reads it (decode.* keys given
    beside it override it, as there)."""
    from mtrain.cli.common import CONFIG_DIR
    from mtrain.errors import MtrainError

    presets = Path(CONFIG_DIR) / "decode"
    if not (presets / f"{name}.yaml").is_file():
        known = ", ".join(sorted(path.stem for path in presets.glob("*.yaml")))
        raise MtrainError(f"decode={name}: no such preset in {presets} (presets: {known})")
    return OmegaConf.load(presets / f"{name}.yaml") or {}


def main(argv: list[str]) -> int:
    if any(arg in HELP_FLAGS for arg in argv):
        print(__doc__.strip())
        return 0
    from mtrain.config import DecodeConfig, RerankConfig, with_values
    from mtrain.config_checks import check_config
    from mtrain.decode.engines.threads import set_decode_threads
    from mtrain.decode.selection.rerank import (
        FeatureScorer,
        check_rerank_files,
        features_of,
        tune_weights,
        write_weights,
    )
    from mtrain.decode.text.progress import DecodeProgress
    from mtrain.decode.translation.translator import translate_sentences
    from mtrain.errors import MtrainError
    from mtrain.evaluate.references import read_run_split
    from mtrain.export.engine import open_engine
    from mtrain.rundir import RunDir
    from mtrain.runtime import resolve_device

    began = time.perf_counter()
    try:
        presets = [arg.split("=", 1)[1] for arg in argv if arg.startswith("decode=")]
        given = OmegaConf.from_dotlist([arg for arg in argv if not arg.startswith("decode=")])
        unknown = [key for key in given if key not in SCRIPT_KEYS and key != "decode"]
        if unknown:
            raise MtrainError(f"{unknown[0]}: unknown key (keys: {', '.join(SCRIPT_KEYS)}, decode=PRESET, decode.*)")
        settings = {**SCRIPT_KEYS, **{key: given[key] for key in given if key != "decode"}}
        if not settings["run"] or not settings["out"]:
            raise MtrainError("run=RUN_DIR and out=WEIGHTS.json are needed")
        from mtrain.config import TranslateConfig

        full = OmegaConf.merge(
            OmegaConf.structured(TranslateConfig),
            {"run": settings["run"], "decode": decode_preset(presets[-1]) if presets else {}},
            {"decode": given.get("decode", {})},
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
        candidates = (
            f"MBR's {cfg.mbr.num_candidates} {cfg.mbr.candidates} candidates"
            if cfg.uses_mbr
            else f"the whole beam of {cfg.beam}"
        )
        say(
            f"decoding {len(sources):,} sentences of {settings['split']} ({candidates} each, {settings['num_threads']} thread(s))"
        )
        start = time.perf_counter()
        with DecodeProgress(
            str(settings["split"]), len(sources), float(settings["progress_every"]), write=say
        ) as progress:
            nbest = translate_sentences(
                engine.model, engine.tokenizer, sources, plain, device, engine.precision, on_batch=progress.update
            )
        decoded = time.perf_counter() - start
        say(f"decoded in {decoded:.1f} s; scoring the features {', '.join(features_of(cfg))}")
        scorer = FeatureScorer(cfg, device)
        encoded = [engine.tokenizer.encode_src(s) + [engine.tokenizer.eos_id] for s in sources]
        start = time.perf_counter()
        features = []  # in eighths, to say how far it is (it can take longer than the decode)
        eighth = max(1, -(-len(encoded) // 8))
        for begin in range(0, len(encoded), eighth):
            features += scorer(engine.tokenizer, encoded[begin : begin + eighth], nbest[begin : begin + eighth])
            if begin + eighth < len(encoded):
                say(f"scored {begin + eighth:,}/{len(encoded):,} sentences ({time.perf_counter() - start:.1f} s)")
        scored = time.perf_counter() - start
        trials = int(settings["trials"])
        say(f"scored in {scored:.1f} s; searching the weights ({trials} seeded trials, corpus BLEU)")
        texts = [[hyp.text for hyp in hyps] for hyps in nbest]
        start = time.perf_counter()
        weights, bleu = tune_weights(
            features, texts, references, scorer.features, trials, int(settings["seed"]), counting_bleu(trials)
        )
        searched = time.perf_counter() - start
        first_bleu = tune_weights(features, texts, references, scorer.features, 1)[1]
        weights.record.update(
            run=str(settings["run"]),
            split=str(settings["split"]),
            decode=OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True),
            bleu_before=first_bleu,
            seconds={"decode": round(decoded, 1), "features": round(scored, 1), "search": round(searched, 1)},
        )
        write_weights(settings["out"], weights)
    except MtrainError as error:
        print(f"tune_rerank: {error}", file=sys.stderr)
        return 2
    print(
        f"{settings['split']} BLEU {first_bleu:.2f} (decoded order) -> {bleu:.2f} reranked; weights "
        + ", ".join(f"{name}={w:.3f}" for name, w in zip(weights.features, weights.weights, strict=True))
        + f"; written to {settings['out']} ({time.perf_counter() - began:.0f} s in all)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
