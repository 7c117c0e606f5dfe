"""n-best reranking: a weighted sum of features per hypothesis, weights from a file.

The features of a hypothesis y of a source x (`FEATURES`; which ones a decode computes is
`features_of`, and the weights file must name exactly those):

- `forward`: the decoding model's score, log p(y | x) / len(y)**alpha (as decoded);
- `reverse`: a reverse-direction run's log p(x | y) per source token (the noisy channel:
  Yee et al. 2019, fairseq's examples/noisychannel), scored teacher-forced and batched;
- `second`: a second forward run's log p(y | x) per output token, teacher-forced;
- `length_ratio`: output tokens / source tokens (eos and tags not counted);
- `mbr`: the expected utility / 100 when MBR decoding made the candidates (mtrain.decode.selection.mbr).

The reverse and second runs must share the decoding run's tokenizer (the same pieces, the
source and target sides swapped for the reverse run) and its languages (swapped):
`check_rerank_files` refuses any other before a model loads, from the runs' config.yaml and
tokenizer files. The weights are tuned on a validation set by `tune_weights`
(scripts/tune_rerank.py), a seeded random search maximising corpus BLEU, and saved as JSON
(`write_weights`): {"features": [...], "weights": [...], ...how they were tuned}.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from mtrain.config import DecodeConfig, to_typed
from mtrain.decode.search.hypothesis import Hypothesis
from mtrain.errors import MtrainError
from mtrain.rundir import RunDir, atomic_write_text, is_export_dir

if TYPE_CHECKING:
    from mtrain.checkpoint.files import LoadedRun
    from mtrain.decode.engines.directions import RunLanguages
    from mtrain.tokenizer import Tokenizer

FEATURES = ("forward", "reverse", "second", "length_ratio", "mbr")

# The largest weight a weights file may give a feature. Tuning draws them within 10 of 0
# (`tune_weights`) and the features are log-probabilities per token, a length ratio and a
# utility / 100; a weight like 1e308 turns the weighted sums into inf or nan, whose order is
# arbitrary, so the hypothesis chosen would be too.
MAX_RERANK_WEIGHT = 1000.0

# A token a scoring model can never emit (a run whose output vocabulary is restricted to the
# pieces of its training targets: a piece of German text seen only on the English side) has
# log-probability -inf, which would make every hypothesis of the sentence score -inf alike;
# it counts this floor instead, so the rest of the sentence still tells the hypotheses apart.
TOKEN_LOG_PROB_FLOOR = -30.0


def features_of(cfg: DecodeConfig) -> list[str]:
    """The features a decode with `cfg` computes, in `FEATURES` order."""
    present = {
        "forward": True,
        "reverse": cfg.rerank.reverse_run is not None,
        "second": cfg.rerank.second_run is not None,
        "length_ratio": True,
        "mbr": to_typed(cfg).uses_mbr,
    }
    return [name for name in FEATURES if present[name]]


@dataclass
class RerankWeights:
    features: list[str]
    weights: list[float]
    record: dict[str, Any] = field(default_factory=dict)  # how they were tuned (written, not read)


def read_weights(path: str | Path) -> RerankWeights:
    """A weights file of `write_weights`; MtrainError naming the file for anything else."""
    key = f"decode.rerank.weights={path}"
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise MtrainError(f"{key}: no such file (write one with scripts/tune_rerank.py)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MtrainError(f"{key}: not a JSON weights file ({error})") from None
    features, weights = (data.get("features"), data.get("weights")) if isinstance(data, dict) else (None, None)
    if (
        not isinstance(features, list)
        or not isinstance(weights, list)
        or len(features) != len(weights)
        or not all(isinstance(w, (int, float)) and math.isfinite(w) for w in weights)
    ):
        raise MtrainError(f'{key}: needs "features" (names) and "weights" (as many finite numbers)')
    too_large = [(name, w) for name, w in zip(features, weights, strict=True) if abs(w) > MAX_RERANK_WEIGHT]
    if too_large:
        name, weight = too_large[0]
        raise MtrainError(
            f"{key}: the weight of {name} is {weight}; weights must be within {MAX_RERANK_WEIGHT:g} of 0 "
            "(tuned ones are within 10: scripts/tune_rerank.py)"
        )
    unknown = [name for name in features if name not in FEATURES]
    if unknown or len(set(features)) != len(features):
        raise MtrainError(f"{key}: features {features}: each once, of {', '.join(FEATURES)}")
    return RerankWeights([str(name) for name in features], [float(w) for w in weights], data)


def write_weights(path: str | Path, weights: RerankWeights) -> None:
    record = {**weights.record, "features": weights.features, "weights": weights.weights}
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def check_rerank_files(cfg: DecodeConfig, run: str | Path | None, tuning: bool = False) -> RerankWeights | None:
    """Before any model loads: the weights file names this decode's features, the reverse
    run translates the other way with the same tokenizer, the second run this way with it.
    `tuning`: the weights are being made (scripts/tune_rerank.py), none is read."""
    rerank = cfg.rerank
    if (rerank.reverse_run or rerank.second_run) and run is None:
        raise MtrainError("decode.rerank: scoring with other runs needs run=RUN_DIR (the decoding run)")
    if rerank.reverse_run is not None:
        _check_partner(run, rerank.reverse_run, "decode.rerank.reverse_run", reverse=True)
    if rerank.second_run is not None:
        _check_partner(run, rerank.second_run, "decode.rerank.second_run", reverse=False)
    weights = None
    if rerank.weights is not None and not tuning:
        weights = read_weights(rerank.weights)
        expected = features_of(cfg)
        if sorted(weights.features) != sorted(expected):
            raise MtrainError(
                f"decode.rerank.weights={rerank.weights}: weighs the features {', '.join(weights.features)}, "
                f"this decode computes {', '.join(expected)} (reverse: decode.rerank.reverse_run, second: "
                "decode.rerank.second_run, mbr: decode.mbr.candidates); tune weights for these settings"
            )
    elif not tuning and (rerank.reverse_run is not None or rerank.second_run is not None):
        key = "reverse_run" if rerank.reverse_run is not None else "second_run"
        raise MtrainError(
            f"decode.rerank.{key}: its score needs a weight: give decode.rerank.weights=FILE "
            "(tuned on a validation set by scripts/tune_rerank.py)"
        )
    return weights


def _check_partner(run: Any, partner: str, key: str, reverse: bool) -> None:
    from mtrain.tokenizer.marian_vocab import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, VOCAB
    from mtrain.tokenizer.tokenizer import SRC_MODEL, TGT_MODEL

    own_files, own_languages = _tokenizer_files_and_languages(Path(run), "run")
    files, languages = _tokenizer_files_and_languages(Path(partner), key, export_allowed=False)
    wanted = {(tgt, src) for src, tgt in own_languages.directions()} if reverse else set(own_languages.directions())
    if not wanted & set(languages.directions()):
        said = ", ".join(f"{s}-{t}" for s, t in languages.directions())
        need = ", ".join(f"{s}-{t}" for s, t in sorted(wanted))
        raise MtrainError(f"{key}={partner}: translates {said}; it must translate {need}")
    if reverse and len(languages.target_languages()) > 1:
        raise MtrainError(
            f"{key}={partner}: translates into {', '.join(languages.target_languages())}; a reverse run must "
            "translate into one language, the decoded source's"
        )
    swap = (
        {SRC_MODEL: TGT_MODEL, TGT_MODEL: SRC_MODEL, SOURCE_SPM: TARGET_SPM, TARGET_SPM: SOURCE_SPM} if reverse else {}
    )
    if reverse and TARGET_VOCAB in own_files:  # Marian's separate vocabularies
        swap.update({VOCAB: TARGET_VOCAB, TARGET_VOCAB: VOCAB})
    expected = {swap.get(name, name): data for name, data in own_files.items()}
    if files != expected:
        raise MtrainError(
            f"{key}={partner}: its tokenizer differs from run={run}'s"
            + (" (source and target swapped)" if reverse else "")
            + ": the hypotheses' token ids must mean the same pieces to both models"
        )


def _tokenizer_files_and_languages(
    path: Path, key: str, export_allowed: bool = True
) -> tuple[dict[str, bytes], RunLanguages]:
    """A run's (or an export directory's) tokenizer model files by name, and its languages."""
    from omegaconf import OmegaConf

    from mtrain.decode.engines.ct2_engine import METADATA_FILE, export_languages
    from mtrain.decode.engines.directions import RunLanguages
    from mtrain.tokenizer.marian_vocab import SOURCE_SPM, TARGET_SPM, TARGET_VOCAB, VOCAB
    from mtrain.tokenizer.tokenizer import JOINT_MODEL, SRC_MODEL, TGT_MODEL

    if not path.is_dir():
        raise MtrainError(f"{key}={path}: no such run directory")
    if is_export_dir(path):
        if not export_allowed:
            raise MtrainError(f"{key}={path}: is an `mtrain export` directory; give the run directory of `mtrain fit`")
        metadata = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
        languages = export_languages(metadata)
        if languages is None:
            raise MtrainError(f"{key}={path}: the export does not record its languages; export the run again")
        tokenizer_dir = path
    else:
        run = RunDir(path)
        if not run.config_file.is_file() or not run.tokenizer_dir.is_dir():
            raise MtrainError(f"{key}={path}: no config.yaml or tokenizer/; give a run directory of `mtrain fit`")
        languages = RunLanguages.of(OmegaConf.load(run.config_file).data)
        tokenizer_dir = run.tokenizer_dir
    files = {
        name: (tokenizer_dir / name).read_bytes()
        for name in (JOINT_MODEL, SRC_MODEL, TGT_MODEL, SOURCE_SPM, TARGET_SPM, VOCAB, TARGET_VOCAB)
        if (tokenizer_dir / name).is_file()
    }
    return files, languages


@functools.lru_cache(maxsize=4)
def load_scoring_run(run: str, device: str) -> LoadedRun:
    """A reverse or second run's best checkpoint (its EMA weights when kept), loaded once per process."""
    from mtrain.checkpoint.files import load_run

    return load_run(run, which="best", device=device, weights="auto")


@torch.inference_mode()
def sequence_log_probs(
    model: Any,
    sources: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    pad_id: int,
    bos_id: int,
    eos_id: int,
    device: torch.device | str = "cpu",
    max_tokens: int = 8000,
) -> list[float]:
    """log p(target + eos | source) per pair, teacher-forced (sources end in eos), in batches
    of at most `max_tokens` padded source + target tokens; a token's log-probability is at
    least `TOKEN_LOG_PROB_FLOOR`."""
    order = sorted(range(len(sources)), key=lambda i: -(len(sources[i]) + len(targets[i])))
    result = [0.0] * len(sources)
    start = 0
    while start < len(order):
        longest = len(sources[order[start]]) + len(targets[order[start]]) + 1
        size = max(1, max_tokens // longest)
        batch = order[start : start + size]
        start += size
        src_len = max(len(sources[i]) for i in batch)
        tgt_len = max(len(targets[i]) for i in batch) + 1
        src = torch.full((len(batch), src_len), pad_id, dtype=torch.long)
        tgt_in = torch.full((len(batch), tgt_len), pad_id, dtype=torch.long)
        tgt_out = torch.full((len(batch), tgt_len), pad_id, dtype=torch.long)
        for row, i in enumerate(batch):
            src[row, : len(sources[i])] = torch.as_tensor(list(sources[i]), dtype=torch.long)
            tgt_in[row, : len(targets[i]) + 1] = torch.as_tensor([bos_id, *targets[i]], dtype=torch.long)
            tgt_out[row, : len(targets[i]) + 1] = torch.as_tensor([*targets[i], eos_id], dtype=torch.long)
        src, tgt_in, tgt_out = src.to(device), tgt_in.to(device), tgt_out.to(device)
        logits = model(src, src.eq(pad_id), tgt_in)  # (batch, tgt_len, vocab)
        lprobs = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
        picked = lprobs.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1).clamp(min=TOKEN_LOG_PROB_FLOOR)
        picked = picked.masked_fill(tgt_out.eq(pad_id), 0.0)
        for row, value in zip(batch, picked.sum(dim=1).tolist(), strict=True):
            result[row] = float(value)
    return result


class FeatureScorer:
    """The features of n-best lists (`FEATURES`), the other runs loaded once."""

    def __init__(self, cfg: DecodeConfig, device: torch.device | str = "cpu") -> None:
        self.features = features_of(cfg)
        self.device = torch.device(device)
        self.max_tokens = cfg.max_tokens
        self.reverse = (
            load_scoring_run(str(cfg.rerank.reverse_run), str(self.device)) if cfg.rerank.reverse_run else None
        )
        self.second = load_scoring_run(str(cfg.rerank.second_run), str(self.device)) if cfg.rerank.second_run else None
        self.reverse_prefix: tuple[int, ...] = ()
        if self.reverse is not None:
            from mtrain.decode.engines.directions import RunLanguages

            languages = RunLanguages.of(self.reverse.config.data)
            if languages.lang_tags:  # its one target language's tag (`check_rerank_files` refuses several)
                target = languages.target(None, "decode.rerank.reverse_run")
                self.reverse_prefix = languages.tokenizer_for(self.reverse.tokenizer, target).source_prefix

    def __call__(
        self, tokenizer: Tokenizer, sources: Sequence[Sequence[int]], nbest: Sequence[Sequence[Hypothesis]]
    ) -> list[np.ndarray]:
        """Per sentence, (len(hypotheses), len(self.features)) feature values.
        `sources`: the decoded ids (the tokenizer's source prefix first, eos last)."""
        plain = [list(ids[len(tokenizer.source_prefix) : -1]) for ids in sources]  # without tag and eos
        pairs = [(s, hyp) for s, hyps in enumerate(nbest) for hyp in hyps]
        columns: dict[str, list[float]] = {
            "forward": [hyp.score for _, hyp in pairs],
            "length_ratio": [len(hyp.tokens) / max(1, len(plain[s])) for s, hyp in pairs],
            "mbr": [(hyp.expected_utility or 0.0) / 100.0 for _, hyp in pairs],
        }
        if self.reverse is not None:
            log_probs = self._score(
                self.reverse,
                [[*self.reverse_prefix, *h.tokens, tokenizer.eos_id] for _, h in pairs],
                [plain[s] for s, _ in pairs],
            )
            columns["reverse"] = [lp / (len(plain[s]) + 1) for lp, (s, _) in zip(log_probs, pairs, strict=True)]
        if self.second is not None:
            log_probs = self._score(self.second, [list(sources[s]) for s, _ in pairs], [h.tokens for _, h in pairs])
            columns["second"] = [lp / (len(h.tokens) + 1) for lp, (_, h) in zip(log_probs, pairs, strict=True)]
        table = np.array([columns[name] for name in self.features], dtype=np.float64).T.reshape(len(pairs), -1)
        out, start = [], 0
        for hyps in nbest:
            out.append(table[start : start + len(hyps)])
            start += len(hyps)
        return out

    def _score(self, loaded: LoadedRun, sources: list[list[int]], targets: list[list[int]]) -> list[float]:
        tok = loaded.tokenizer
        return sequence_log_probs(
            loaded.model, sources, targets, tok.pad_id, tok.bos_id, tok.eos_id, self.device, self.max_tokens
        )


def weight_vector(weights: RerankWeights, features: Sequence[str]) -> np.ndarray:
    """The weights in the order of `features`."""
    by_name = dict(zip(weights.features, weights.weights, strict=True))
    return np.array([by_name[name] for name in features], dtype=np.float64)


def rerank(nbest: Sequence[Hypothesis], features: np.ndarray, weights: np.ndarray) -> list[Hypothesis]:
    """`nbest` by `features @ weights`, best first, ties in the given order; each hypothesis
    gets `.rerank_score`."""
    if not nbest:
        return []
    scores = features @ weights
    for hyp, value in zip(nbest, scores.tolist(), strict=True):
        hyp.rerank_score = float(value)
    return [nbest[i] for i in np.argsort(-scores, kind="stable")]


def tune_weights(
    features: Sequence[np.ndarray],
    texts: Sequence[Sequence[str]],
    references: Sequence[str],
    names: Sequence[str],
    trials: int = 200,
    seed: int = 1,
    corpus_bleu: Callable[[list[str], list[str]], float] | None = None,
) -> tuple[RerankWeights, float]:
    """Seeded random search for the weights that maximise corpus BLEU of the reranked
    first-best on a validation set. The decode's own ranking feature (`mbr` with MBR, else
    `forward`) keeps weight 1 (the scale); the others are drawn from U(-1, 1) x 10 ** U(-1, 1);
    the first trial is the decoded order itself (that feature alone), so the search never
    returns worse than it. Returns the best weights and their BLEU. `features[i]`
    (k_i, len(names)), `texts[i]` its k_i hypotheses."""
    import sacrebleu

    score = corpus_bleu or (lambda hyps, refs: float(sacrebleu.corpus_bleu(hyps, [refs]).score))
    rng = np.random.default_rng(seed)
    anchor = list(names).index("mbr" if "mbr" in names else "forward")
    best_weights = np.zeros(len(names))
    best_weights[anchor] = 1.0
    best_bleu = -1.0
    candidate = best_weights.copy()
    for trial in range(trials):
        if trial > 0:
            candidate = rng.uniform(-1.0, 1.0, len(names)) * 10.0 ** rng.uniform(-1.0, 1.0, len(names))
            candidate[anchor] = 1.0
        firsts = [
            hyps[int(np.argmax(f @ candidate))] if len(hyps) else "" for f, hyps in zip(features, texts, strict=True)
        ]
        bleu = score(firsts, list(references))
        if bleu > best_bleu:
            best_bleu, best_weights = bleu, candidate.copy()
    record = {"tuned": {"trials": trials, "seed": seed, "bleu": best_bleu, "sentences": len(references)}}
    return RerankWeights(list(names), [float(w) for w in best_weights], record), best_bleu
