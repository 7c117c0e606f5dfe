"""`train:` (configs/train/): the optimiser, schedule, budgets, precision, checkpoints and the
training-time extras (EMA, guided alignment, term-aware training)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mtrain.config.choice import Choice
from mtrain.config_fields import ranged
from mtrain.durations import parse_budget_share, parse_duration
from mtrain.errors import MtrainError


class Scheduler(Choice):
    inverse_sqrt = "inverse_sqrt"
    cosine = "cosine"
    linear = "linear"
    constant = "constant"


class Precision(Choice):
    """A numeric precision, and what it means for each engine: `dtype` (the torch dtype of
    its products), `is_low` (autocast with that dtype), `ct2_compute_type` (CTranslate2's
    name). `auto` is resolved per device by mtrain.runtime before any of them is asked."""

    auto = "auto"
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"

    @property
    def dtype(self) -> Any:
        """torch.float32 | torch.bfloat16 | torch.float16 (torch is imported on first use)."""
        import torch

        if self is Precision.auto:
            raise ValueError("precision auto has no dtype: resolve it for a device first (mtrain.runtime)")
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.value]

    @property
    def is_low(self) -> bool:
        """bf16 or fp16: products run under autocast in that dtype (norms and softmax stay fp32)."""
        return self in (Precision.bf16, Precision.fp16)

    @property
    def ct2_compute_type(self) -> str:
        """CTranslate2's compute type; auto keeps the exported weights' type ("default")."""
        return {"auto": "default", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[self.value]


@dataclass
class TrainConfig:
    max_tokens: int = ranged(4096, at_least=1)  # per batch: sentences x padded length of the longer side
    update_freq: int = ranged(1, at_least=1)  # gradient accumulation steps per update
    lr: float = ranged(5e-4, above=0)
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = ranged(1e-8, above=0)
    weight_decay: float = ranged(0.0, at_least=0)
    scheduler: Scheduler = Scheduler.inverse_sqrt
    warmup_updates: int = ranged(4000, at_least=0)
    min_lr: float = ranged(0.0, at_least=0)
    # Horizon of cosine/linear decay, in updates. When null and a time budget is set (max_time
    # or max_train_time), the decay follows elapsed training time instead (ends with training).
    decay_updates: int | None = ranged(None, at_least=1)
    clip_norm: float = ranged(1.0, at_least=0)  # 0 disables
    label_smoothing: float = ranged(0.1, at_least=0, below=1)
    max_updates: int | None = ranged(None, at_least=1)
    max_epochs: int | None = ranged(None, at_least=1)
    # The wall time of the whole run ("90s", "20m", "2h"): preparation, training, validations,
    # checkpoints and the test decode. Training gets what is left once the time spent before it
    # and the estimated cost of the last validation and the test decode are set aside
    # (mtrain/train/budget.py); the learning-rate schedule follows that share.
    max_time: str | None = None
    # The training clock alone (updates; validation, checkpoints and the test come on top), as
    # a benchmark compares toolkits; with max_time, the smaller of the two governs.
    max_train_time: str | None = None
    patience: int | None = ranged(None, at_least=1)  # validations without a val-BLEU gain before stopping
    precision: Precision = Precision.auto
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    # CUDA: fp32 matrix products (fp32 runs, and what bf16 autocast leaves in fp32) on TF32 tensor
    # cores, as validation and the test decode too; false: full fp32 products (mtrain.runtime.set_tf32).
    tf32: bool = True
    num_threads: int | None = ranged(None, at_least=1)  # CPU intra-op threads of training (null: torch's default)
    # CPU threads of validation (its loss and its decode) and of the test decode (null: 1, as
    # translate and eval decode, whatever the load; mtrain/decode/engines/threads.py): a test decode at
    # train.num_threads=2 on busy cores ran 5x slower than `mtrain eval` on the same checkpoint.
    decode_num_threads: int | None = ranged(None, at_least=1)
    validate_every: int = ranged(1000, at_least=1)
    # Also validate (and checkpoint) every this much training time ("2m"); null: by updates only.
    validate_every_time: str | None = None
    valid_bleu: bool = True
    valid_max_sentences: int | None = ranged(None, at_least=1)
    log_every: int = ranged(50, at_least=1)
    # Also log at least this often ("30s"), whichever comes first: a training line however slow
    # the updates, and the progress of the validation and test decodes; null: by updates only.
    log_every_time: str | None = "30s"
    # The training loss's points (log, TensorBoard's train/loss, `mtrain report`'s curves): one
    # every this many updates, each the mean over exactly those updates, so that curves of runs
    # compare point for point whatever the machine's load (the lines above come by time too).
    loss_every: int = ranged(50, at_least=1)
    keep_last: int = ranged(3, at_least=1)  # update_N.pt checkpoints kept besides last/best
    # Also checkpoint on this wall-clock interval ("10m"), independent of validation, so a
    # kill never loses more than this much training. null: only when validating.
    save_every: str | None = None
    # Under DDP, the longest a rank waits for the others in one collective ("30m"): it must cover
    # what rank 0 does alone while they wait (validation, a checkpoint, the test decode), and is
    # how long a rank that hangs (or dies unseen, as NCCL may miss) holds the job (docs/TRAINING.md).
    ddp_timeout: str = "30m"
    resume: bool = False
    # With resume: continue from this checkpoint of the run (e.g. update_200) instead of last.
    resume_from: str | None = None
    # torch.compile the model and its loss: one static graph per batch shape with shape buckets
    # (the default when compiling), else one dynamic graph for every shape (mtrain/train/compilation.py).
    # For GPUs: on a CPU the eager step is faster (0.80x of eager in fp32; docs/PERFORMANCE.md).
    compile: bool = False
    # Also capture the compiled forward and backward in CUDA graphs (torch.compile's
    # "reduce-overhead" mode): one graph recorded per batch shape, then replayed with one launch
    # instead of ~700 (docs/PERFORMANCE.md, GPU). Compiles even with train.compile=false; CUDA only.
    cuda_graphs: bool = False
    max_bad_updates: int = ranged(5, at_least=1)  # consecutive non-finite updates before aborting
    max_oom_batches: int = ranged(5, at_least=1)  # consecutive out-of-memory batches before aborting
    instruments: bool = False  # per-layer statistics to TensorBoard (ablation bench)
    instrument_every: int = ranged(100, at_least=1)
    # Warmup as a share of the training time ("9%": of max_train_time, or of max_time's training
    # share) or a duration ("60s"), so the learning-rate curve has the same shape on a slow
    # machine as on a fast one. Used only with a time budget, and then instead of warmup_updates
    # (see mtrain/train/schedule.py).
    warmup_time: str | None = None
    # Round training batches' src/tgt lengths up to a multiple of this (1: no rounding), which
    # bounds the number of batch shapes per epoch (torch.compile, allocator, oneDNN's buffers);
    # mtrain/batches/batching.py. null: 8 on CUDA, 4 for bf16 on a CPU (less memory, as fast),
    # 1 for fp32 on a CPU (there padding costs its FLOPs: -5%). docs/PERFORMANCE.md.
    pad_to_multiple: int | None = ranged(None, at_least=1)
    # Pad every training batch to one of at most this many shapes: both sides to one of this
    # many widths chosen from the corpus's lengths (least padding), one row count per width
    # (mtrain/batches/buckets.py); 0: off. null: 8 when compiling (train.compile or
    # train.cuda_graphs: a CUDA graph per shape), else off (on a CPU padding costs its FLOPs).
    shape_buckets: int | None = ranged(None, at_least=0)
    # Exponential moving average of the weights (fairseq --ema-decay, Marian
    # --exponential-smoothing), e.g. 0.999; null: none. When on, validation, best.pt and the
    # test decode use the averaged weights (mtrain/train/ema.py).
    ema_decay: float | None = ranged(None, above=0, below=1, why=", e.g. 0.999, or null for none")
    ema_start_update: int = ranged(0, at_least=0)  # before this update the average follows the weights exactly
    # Guided alignment (Garg et al. 2019; Marian's --guided-alignment): a Pharaoh file of word
    # alignments, line for line with the training corpus (scripts/align_eflomal.py); one
    # cross-attention head is trained towards them (mtrain/batches/guided_alignment.py). null: off.
    guided_alignment: str | None = None
    # of the alignment cross-entropy beside the translation loss
    guided_alignment_weight: float = ranged(0.1, at_least=0)
    guided_alignment_layer: int = -2  # the decoder layer (negative: from the last): Garg's penultimate
    guided_alignment_head: int = 0  # the head of that layer that is guided
    # Term-aware training (Dinu et al. 2019; needs model.term_factors=true): a Pharaoh file of word
    # alignments, line for line with the training corpus (as train.guided_alignment's); in a share
    # `term_rate` of the pairs, up to `term_max_words` aligned content words get their target words
    # written after them as a term (mtrain/batches/term_training.py), so the model learns to
    # translate a word with the term it is given. null: off.
    term_alignment: str | None = None
    term_rate: float = ranged(0.8, at_least=0, at_most=1)
    term_max_words: int = ranged(3, at_least=1)
    # The share of those terms that are another term of the corpus, written into the target too
    # (`dog` -> `shirt`): the model learns to write the term it is given in place of its own word.
    term_replace_rate: float = ranged(0.5, at_least=0, at_most=1)
    # Content words only: the source side's most frequent words (articles, prepositions) never get a term.
    term_skip_frequent: int = ranged(100, at_least=0)

    def check(self, prefix: str) -> None:
        if self.cuda_graphs and self.shape_buckets == 0:
            raise MtrainError(
                f"{prefix}.cuda_graphs: a CUDA graph is recorded for every batch shape, and {prefix}.shape_buckets=0 "
                f"leaves their number unbounded; set {prefix}.shape_buckets (e.g. 8) or leave it null"
            )
        if self.min_lr > self.lr:
            raise MtrainError(f"{prefix}.min_lr: {self.min_lr} is above {prefix}.lr={self.lr}")
        if len(self.betas) != 2 or not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise MtrainError(f"{prefix}.betas: {list(self.betas)} must be two numbers in [0, 1), e.g. [0.9,0.98]")
        for name in ("max_time", "max_train_time", "ddp_timeout"):
            value = getattr(self, name)
            try:
                seconds = parse_duration(value, f"{prefix}.{name}")
            except MtrainError:
                raise MtrainError(f"{prefix}.{name}: {value!r} is not a duration; write e.g. 90s, 20m or 2h") from None
            if seconds is not None and seconds <= 0:
                raise MtrainError(f"{prefix}.{name}: {value!r} must be a positive duration, e.g. 90s, 20m or 2h")
        for name in ("validate_every_time", "save_every", "log_every_time"):
            value = getattr(self, name)
            try:
                seconds = parse_duration(value, f"{prefix}.{name}")
            except MtrainError:
                seconds = -1.0
            if seconds is not None and seconds <= 0:
                raise MtrainError(
                    f"{prefix}.{name}: {value!r} must be a positive duration, e.g. 90s, 20m or 2h (or null)"
                )
        # A duration of warmup must be shorter than the training time; max_time's training share is
        # only known at the start of training, so its whole is the bound here.
        budget_key = "max_train_time" if self.max_train_time is not None else "max_time"
        budget = getattr(self, budget_key)
        try:
            share = parse_budget_share(self.warmup_time, budget, f"{prefix}.warmup_time")
        except MtrainError:
            share = -1.0
        if share is not None and not 0.0 <= share < 1.0:
            raise MtrainError(
                f"{prefix}.warmup_time: {self.warmup_time!r} must be a share of the training time from 0% to "
                f"below 100% (e.g. 9%) or a duration shorter than {prefix}.{budget_key}={budget}"
            )
        if (
            self.scheduler in (Scheduler.cosine, Scheduler.linear)
            and self.decay_updates is None
            and self.max_time is None
            and self.max_train_time is None
            and self.max_updates is None
        ):
            raise MtrainError(
                f"{prefix}.scheduler: {self.scheduler} needs a horizon: set {prefix}.decay_updates, "
                f"{prefix}.max_updates, {prefix}.max_time or {prefix}.max_train_time"
            )
