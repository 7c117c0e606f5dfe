"""`mtrain fit` and `mtrain prepare` (configs/fit.yaml, configs/prepare.yaml): the sections of a run,
its seed and the parent it starts from, with the rules between sections."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field

from mtrain.config.choice import Choice
from mtrain.config.convert import to_typed
from mtrain.config.data import DataConfig, corpora_rules
from mtrain.config.decode import DecodeConfig, DecodeWeights
from mtrain.config.model import ModelConfig, resolved_model
from mtrain.config.tokenizer import TokenizerConfig
from mtrain.config.train import TrainConfig
from mtrain.config_fields import ranged
from mtrain.errors import MtrainError


class InitVocab(Choice):
    """Which rows of an imported M2M100/NLLB vocabulary a fine-tune keeps: all of them, or the
    pieces its training corpora use and the codes of its languages (mtrain.tokenizer.trimmed_vocab)."""

    full = "full"
    corpus = "corpus"


@dataclass
class FitConfig:
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    seed: int = ranged(1, at_least=0, below=2**32, shown="in [0, 2**32)", why="(numpy's seed range)")
    # Start a new run from another run's weights (a run directory: its best.pt; or a checkpoint
    # file; or a Hugging Face model directory or hub id: docs/FINETUNE.md) and reuse its tokenizer:
    # fine-tuning, continued training, domain adaptation. Unlike train.resume, the data, schedule
    # and optimiser are this run's own.
    init_from: str | None = None
    init_weights: DecodeWeights = DecodeWeights.auto  # the parent's EMA or trained weights
    init_keep_optimizer: bool = False  # also take the parent's Adam moments (last.pt holds them)
    # corpus: trim an imported M2M100/NLLB vocabulary to the pieces the training corpora use and
    # the run's language codes (NLLB's 256k rows to a few thousand: docs/FINETUNE.md).
    init_vocab: InitVocab = InitVocab.full

    def check(self, prefix: str) -> None:
        corpora_rules(self.data, self.tokenizer)
        self._check_guided_alignment()
        self._check_term_alignment()
        if self.init_from is None:
            if self.init_keep_optimizer:
                raise MtrainError(
                    "init_keep_optimizer: true needs init_from=RUN_DIR|CHECKPOINT, the run whose "
                    "optimiser state to keep (a resume keeps its own: train.resume=true)"
                )
            if self.init_vocab != InitVocab.full:
                raise MtrainError(
                    f"init_vocab: {self.init_vocab.value} trims the vocabulary of init_from=MODEL_DIR (an M2M100 or "
                    "NLLB-200 model), which is not set"
                )
            if self.init_weights != DecodeWeights.auto:
                raise MtrainError(
                    f"init_weights: {self.init_weights} chooses the weights of init_from=RUN_DIR|CHECKPOINT, "
                    "which is not set"
                )
        elif self.tokenizer.path is not None:
            raise MtrainError(
                f"tokenizer.path={self.tokenizer.path}: a fine-tune encodes with its parent's tokenizer (init_from="
                f"{self.init_from}); drop tokenizer.path"
            )

    def _check_alignment_file(self, key: str) -> None:
        """train.guided_alignment and train.term_alignment: one training corpus, read as it is
        segmented (the file's lines are its lines and its words the pieces' words)."""
        if self.data.corpora:
            raise MtrainError(
                f"train.{key}: with data.corpora the file's lines match no one corpus; "
                "train with it on a single corpus (data=...)"
            )
        if self.data.subword_sampling.alpha > 0:
            raise MtrainError(f"train.{key}: not with data.subword_sampling (sampled copies); switch one off")
        if self.data.lang_tags:
            raise MtrainError(f"train.{key}: not with data.lang_tags (tagged sources); switch one off")

    def _check_term_alignment(self) -> None:
        """train.term_alignment: a term-aware model, and sources whose words stay where the
        alignment file says (guided alignment reads the plain sources' pieces)."""
        if self.train.term_alignment is None:
            return
        self._check_alignment_file("term_alignment")
        if not self.model.term_factors:
            raise MtrainError(
                "train.term_alignment: the model reads its terms through a source factor; add model.term_factors=true"
            )
        if self.train.guided_alignment is not None:
            raise MtrainError(
                "train.term_alignment: not with train.guided_alignment (its links count the plain sources' "
                "words); switch one off"
            )

    def _check_guided_alignment(self) -> None:
        """train.guided_alignment: the file's corpus (`_check_alignment_file`) and a head the
        model has (the file itself: mtrain.config_checks)."""
        if self.train.guided_alignment is None:
            return
        self._check_alignment_file("guided_alignment")
        layers, layer, heads, head = (
            self.model.decoder_depth,
            self.train.guided_alignment_layer,
            self.model.heads,
            self.train.guided_alignment_head,
        )
        if not -layers <= layer < layers:
            raise MtrainError(
                f"train.guided_alignment_layer: {layer} is not a layer of the "
                f"{layers}-layer decoder (0..{layers - 1}, or negative from the last)"
            )
        if not -heads <= head < heads:
            raise MtrainError(f"train.guided_alignment_head: {head} is not one of the {heads} heads (0..{heads - 1})")


def with_resolved_model(cfg: FitConfig) -> FitConfig:
    """A copy of a FitConfig (or its composed node) as the dataclass, whose `model` section says
    what is built (see resolved_model), for what a run records (config.yaml, checkpoints);
    `cfg` itself is left as composed."""
    typed: FitConfig = to_typed(cfg)
    return dataclasses.replace(typed, model=resolved_model(typed.model))


# A model's id on the Hugging Face Hub, `owner/name` (Helsinki-NLP/opus-mt-de-en): two names of letters,
# digits, `_`, `.` and `-`, each starting with a letter, digit or `_`, so that `./run`, `../run`,
# `~/run` and `/run` stay paths, as the Hub's own rule has them (no name starts with `.` or `-`).
_HUB_ID = re.compile(r"\w[\w.-]*/\w[\w.-]*")


def is_hub_id(text: str) -> bool:
    """Whether `init_from` names a model on the Hugging Face Hub rather than a path (a path that
    exists is a path whatever it looks like: the callers ask that first). The one answer for the
    config checks (mtrain.config_checks) and the download (mtrain.train.hf_parent)."""
    return _HUB_ID.fullmatch(text) is not None
