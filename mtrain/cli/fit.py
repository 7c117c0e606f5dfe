"""`mtrain fit`: raw parallel text -> tokenizer -> trained model -> test BLEU, in one run dir.

The run directory is Hydra's output directory. This module wires the stages together in
the order a reader would expect; each stage lives in its own package.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from mtrain.cli.common import mtrain_app
from mtrain.config import with_resolved_model
from mtrain.errors import MtrainError

log = logging.getLogger("mtrain")


def run_fit(cfg: DictConfig, run_dir: Path) -> Dict[str, Any]:
    """Train as `cfg` says, writing everything into `run_dir`; returns metrics.json's content."""
    from mtrain.data import prepare_data
    from mtrain.decode.generator import position_limit
    from mtrain.model import build_model
    from mtrain.train.checkpoint import CHECKPOINT_DIR
    from mtrain.train.distributed import init_distributed, shutdown_distributed
    from mtrain.train.faults import TrainingDiverged
    from mtrain.train.runtime import resolve_device, resolve_precision, seed_everything, set_threads
    from mtrain.train.trainer import Trainer

    cfg = with_resolved_model(cfg)  # config.yaml and the checkpoints record what is built
    dist = init_distributed(cfg.train.device)
    device = resolve_device(cfg.train.device, dist.local_rank)
    precision = resolve_precision(cfg.train.precision, device)
    set_threads(cfg.train.num_threads)
    seed_everything(cfg.seed)
    _check_writable(run_dir)

    last_checkpoint = run_dir / CHECKPOINT_DIR / "last.pt"
    if last_checkpoint.exists() and not cfg.train.resume:
        raise MtrainError(
            f"{run_dir}: this run directory already has checkpoints; pass train.resume=true to "
            "continue it, or choose a new hydra.run.dir (nothing was overwritten)"
        )
    if cfg.train.resume and not last_checkpoint.exists():
        log.warning("train.resume=true but %s has no checkpoint yet: starting from scratch", run_dir)

    # Rank 0 prepares (tokenizer, encoded cache); the others then read the same cache.
    if dist.is_main:
        data = prepare_data(cfg.data, cfg.tokenizer, log=log.info)
    dist.barrier()
    if not dist.is_main:
        data = prepare_data(cfg.data, cfg.tokenizer, log=lambda *_: None)
    if dist.is_main:
        data.tokenizer.save(run_dir / "tokenizer")
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True), encoding="utf-8")

    model = build_model(cfg.model, data.tokenizer.src_vocab_size, data.tokenizer.tgt_vocab_size,
                        data.tokenizer.pad_id).to(device)
    check_eval_lengths(data, position_limit(model), cfg.data)
    trainer = Trainer(cfg, run_dir, data, model, device, precision, dist)
    if cfg.train.resume and last_checkpoint.exists():
        trainer.resume_from(last_checkpoint)

    metrics: Dict[str, Any] = {"run_dir": str(run_dir), "device": str(device), "precision": precision}
    try:
        metrics.update(trainer.fit())
    except TrainingDiverged:
        if dist.is_main:
            metrics.update(updates=trainer.state.update, diverged=True,
                           train_time_s=round(trainer.state.train_seconds, 2))
            _write_metrics(run_dir, metrics)
        raise
    finally:
        if trainer.writer is not None:
            trainer.writer.close()

    if dist.is_main:
        metrics["valid"] = dict(trainer.last_validation, best_update=trainer.state.best_update)
        if cfg.train.valid_bleu:
            metrics["valid"]["best_bleu"] = trainer.state.best_score
        metrics["test"] = score_test_split(cfg, run_dir, trainer, device, precision)
        _write_metrics(run_dir, metrics)
        log.info("test | %s", " | ".join(f"{k} {v:.2f}" for k, v in metrics["test"].items() if isinstance(v, float)))
    dist.barrier()
    shutdown_distributed(dist)
    return metrics


def check_eval_lengths(data, limit: Optional[int], data_cfg: DictConfig) -> None:
    """Refuse, before training, a validation or test pair longer than the model can embed.

    Those splits are never filtered (they are scored as they are), so such a pair would
    otherwise stop the run at its first validation or, worse, after training at the test.
    """
    if limit is None:
        return
    for split in ("valid", "test"):
        corpus = getattr(data, split)
        positions = np.maximum(corpus.src_lengths, corpus.tgt_lengths + 1)  # src + eos; [bos] + tgt
        index = int(np.argmax(positions))
        if positions[index] > limit:
            raise MtrainError(
                f"data: pair {index + 1} of the {split} split (data.splits.{split}="
                f"{getattr(data_cfg.splits, split)}) is {int(positions[index])} subword tokens long but the "
                f"model embeds at most {limit} positions (model.max_positions); shorten or remove that "
                "line, or raise model.max_positions"
            )


def score_test_split(cfg: DictConfig, run_dir: Path, trainer, device, precision: str) -> Dict[str, Any]:
    """Decode the test split with the best checkpoint (beam search) and score it with sacreBLEU."""
    from mtrain.decode import translate_sentences
    from mtrain.evaluate.metrics import score_corpus
    from mtrain.train.checkpoint import find_checkpoint, load_checkpoint

    best = load_checkpoint(find_checkpoint(run_dir, "best"))
    trainer.model.load_state_dict(best["model"])
    trainer.model.eval()
    sources = list(trainer.data.test_text.src)
    references = list(trainer.data.test_text.tgt)
    start = time.perf_counter()
    with torch.inference_mode():
        hypotheses = translate_sentences(trainer.model, trainer.tokenizer, sources, cfg.decode, device, precision)
    seconds = time.perf_counter() - start
    texts = [nbest[0].text for nbest in hypotheses]
    (run_dir / "eval").mkdir(exist_ok=True)
    (run_dir / "eval" / "test.hyp").write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    scores = score_corpus(texts, [references])
    result: Dict[str, Any] = {"checkpoint": "best.pt", "update": int(best.get("update", 0)),
                              "beam": cfg.decode.beam, "sentences": len(texts),
                              "decode_sentences_per_s": round(len(texts) / max(seconds, 1e-9), 2)}
    for metric, values in scores.items():
        result[metric] = float(values["score"])
        result[f"{metric}_signature"] = values["signature"]
    return result


def _write_metrics(run_dir: Path, metrics: Dict[str, Any]) -> None:
    tmp = run_dir / ".metrics.json.tmp"
    tmp.write_text(json.dumps(metrics, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, run_dir / "metrics.json")


def _check_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write_test.{os.getpid()}"  # one per rank: ranks share the directory
        probe.write_text("ok")
        probe.unlink()
    except OSError as error:
        raise MtrainError(
            f"{run_dir}: output directory is not writable ({error.strerror}); choose another with "
            "hydra.run.dir=PATH"
        ) from error


@mtrain_app("fit")
def main(cfg: DictConfig) -> None:
    run_fit(cfg, Path(HydraConfig.get().runtime.output_dir))
