"""Typed configuration for every mtrain command, registered in Hydra's ConfigStore.

The YAML files under `configs/` only set values, and only those that differ from the
defaults here; the dataclasses define which keys exist, their types and, for choices, their
allowed values (`Choice` enums), so a typo (`model.d_modle=512`), a wrong type
(`train.lr=fast`) or an unknown choice (`model.activation=rleu`) fails at composition time,
naming the key, before any work starts.

The rules a type cannot say live here too, beside the fields (mtrain.config_fields walks them
for every command before any work, through mtrain.config_checks.check_config):

- a number's range is its field's metadata, written as its default:
  `beam: int = ranged(5, at_least=1)`, `top_p: float = ranged(0.9, above=0, at_most=1)`,
  `train_limit: int | None = ranged(None, at_least=1)` (null passes), with `why=` for what the
  refusal adds (`port: 70000 must be in 0..65535 (0: any free port)`). A new number field
  writes its range so, never as a check elsewhere; every float is refused when inf or nan;
- a rule between keys of one section is that dataclass's `check(self, prefix)` (`prefix`: the
  section's dotted key, e.g. "decode"), raising MtrainError(f"{prefix}.<key>: <why>"); a rule
  between sections is the command's `check` (FitConfig: the guided head against the model);
- what needs the file system or another run (a file exists, a run's config.yaml) stays in
  mtrain.config_checks; so do the decode-combination rules shared with the HTTP APIs.

Config groups mirror the package: `data/` -> mtrain.data, `tokenizer/` ->
mtrain.tokenizer, `model/` -> mtrain.model, `train/` -> mtrain.train,
`decode/` -> mtrain.decode; `experiment/` presets combine them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import OmegaConf

from mtrain.config_fields import check_section, ranged
from mtrain.durations import parse_budget_share, parse_duration
from mtrain.errors import MtrainError

# translate's and eval's max_line_chars: a long paragraph is some thousands; a megabyte is no sentence
DEFAULT_MAX_LINE_CHARS = 200_000


class Choice(str, Enum):
    """One of a fixed set of strings (a config key's allowed values).

    OmegaConf refuses any other value when the config is composed, naming the key. A member
    is a `str` equal to its value and prints as it, so `cfg.model.norm_position == "pre"`,
    `f"{cfg.train.precision}"`, JSON and the YAML spellings are unchanged.
    """

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class DataFormat(Choice):
    text = "text"
    tsv = "tsv"
    jsonl = "jsonl"

    @property
    def one_file_per_language(self) -> bool:
        """text: a file per split and language; tsv/jsonl: one file per split holding both sides."""
        return self is DataFormat.text


class InvalidUtf8(Choice):
    skip = "skip"
    error = "error"


class Normalization(Choice):
    NFKC = "NFKC"
    NFC = "NFC"


class TokenizerModel(Choice):
    unigram = "unigram"
    bpe = "bpe"


class Activation(Choice):
    relu = "relu"
    gelu = "gelu"
    silu = "silu"  # x * sigmoid(x), Marian's "swish" (OPUS-MT models)
    swiglu = "swiglu"

    @property
    def gated(self) -> bool:
        """A gated linear unit: a third matrix whose activation multiplies the up projection."""
        return self is Activation.swiglu


class NormPosition(Choice):
    pre = "pre"
    post = "post"


class ResidualInput(Choice):
    raw = "raw"
    normalized = "normalized"


class NormType(Choice):
    layernorm = "layernorm"
    rmsnorm = "rmsnorm"


class OutputVocab(Choice):
    full = "full"
    target = "target"


class Positions(Choice):
    sinusoidal = "sinusoidal"
    # Sinusoids at frequencies 10000^(-2i/d_model) (Marian's and transformers' layout, OPUS-MT
    # models) instead of fairseq's 10000^(-i/(d_model/2 - 1)); sines, then cosines, in both.
    sinusoidal_marian = "sinusoidal_marian"
    learned = "learned"
    rope = "rope"
    none = "none"


class DecoderOrder(Choice):
    self_cross_ffn = "self_cross_ffn"
    cross_self_ffn = "cross_self_ffn"
    self_ffn_cross = "self_ffn_cross"

    @property
    def sublayers(self) -> tuple[str, ...]:
        """The decoder layer's sublayers in the order they run, e.g. ("cross", "self", "ffn")."""
        return tuple(self.value.split("_"))


class AttentionImpl(Choice):
    auto = "auto"
    sdpa = "sdpa"
    math = "math"


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


class Sampling(Choice):
    none = "none"
    topk = "topk"
    topp = "topp"
    epsilon = "epsilon"  # tokens of probability below decode.epsilon cut (Hewitt et al. 2022)


class MbrCandidates(Choice):
    """Where MBR decoding's candidates come from (mtrain/decode/mbr.py); none: no MBR."""

    none = "none"
    beam = "beam"  # the beam's n-best (beam = nbest = num_candidates)
    sample = "sample"  # num_candidates samples (decode.sampling; none means epsilon)
    both = "both"  # half from the beam (rounded up), the rest sampled


class MbrUtility(Choice):
    chrf = "chrf"  # sacreBLEU's sentence chrF (chrF2, character 6-grams)
    bleu = "bleu"  # sacreBLEU's sentence BLEU (exp smoothing, effective order)


class ConstraintOrder(Choice):
    """`mtrain translate constraints=`: whether input lines carry constraints (fairseq's format)."""

    none = "none"  # a line is the source (a tab in it is part of the source)
    unordered = "unordered"  # `source<TAB>phrase<TAB>...`: each phrase somewhere in the output
    ordered = "ordered"  # the same, the phrases in their order


class Engine(Choice):
    torch = "torch"
    ctranslate2 = "ctranslate2"


class DecodeWeights(Choice):
    """Which of a checkpoint's weights decode: auto is the EMA weights when the run kept them
    (train.ema_decay), else the trained ones; raw always the trained ones."""

    auto = "auto"
    ema = "ema"
    raw = "raw"


class EvalSplit(Choice):
    valid = "valid"
    test = "test"


class ExportFormat(Choice):
    ctranslate2 = "ctranslate2"
    argos = "argos"  # an Argos Translate package, out=FILE.argosmodel (mtrain/export/argos.py)
    hf = "hf"  # a transformers model directory (mtrain.export.hf_model)


@dataclass
class SplitsConfig:
    """Names of the splits as the local files (or the Hub dataset) call them."""

    train: str = "train"
    valid: str = "val"
    test: str | None = "test_2016_flickr"  # null: no test split (a smoke run, or no test set yet)


@dataclass
class HubConfig:
    """Where the corpus lives on the Hugging Face Hub (used when no local copy is found)."""

    id: str | None = None  # e.g. "wmt/wmt14"
    config: str | None = None  # e.g. "de-en"
    # Branch, tag or commit; null: main. "refs/convert/parquet" reads the Hub's parquet export
    # (mtrain falls back to it by itself when main holds a loading script).
    revision: str | None = None
    # Our split name (train/valid/test) -> the Hub's split name.
    splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "valid": "validation", "test": "test"})
    # Column holding a {lang: text} dict (wmt14 style); when null, one column per
    # language named by `src_field`/`tgt_field` (defaulting to the language codes).
    translation_field: str | None = "translation"
    src_field: str | None = None
    tgt_field: str | None = None


@dataclass
class CleanConfig:
    """Filters applied to training pairs (validation/test sets are never filtered)."""

    max_len: int = ranged(256, at_least=1)  # subword tokens per side
    min_len: int = ranged(1, at_least=0)
    # longer/shorter side, in subword tokens
    max_len_ratio: float = ranged(3.0, at_least=1.0, why="(the longer side over the shorter)")
    drop_identical: bool = False
    deduplicate: bool = False
    normalize: Normalization | None = None
    # Drop training pairs whose source side also occurs in the validation or test split
    # (they are counted and logged either way; metrics.json records the counts).
    drop_eval_overlap: bool = False

    def check(self, prefix: str) -> None:
        if self.min_len > self.max_len:
            raise MtrainError(f"{prefix}.min_len: {self.min_len} is above {prefix}.max_len={self.max_len}")


@dataclass
class SubwordSamplingConfig:
    """Subword regularisation (Kudo 2018; BPE-dropout, Provilkov et al. 2020): each epoch trains
    on another sampled segmentation of the training split. Validation and test stay deterministic."""

    # 0: off. Unigram: the smoothing exponent of the segmentation lattice (smaller: flatter,
    # longer sequences; 0.5 changes ~40% of Multi30k's sentences and adds 3% tokens).
    # BPE: the probability of dropping a merge (BPE-dropout, e.g. 0.1).
    alpha: float = 0.0
    nbest_size: int = -1  # unigram: sample from the n best segmentations; -1: from all of them
    copies: int = 10  # segmentations encoded (and cached); epoch e trains on copy (e - 1) % copies


@dataclass
class CorpusConfig:
    """One training corpus of `data.corpora`. Unset (null) keys take the value of `data`'s key
    of the same name; the corpus is found as `data` is (local_dir, $MTRAIN_DATA_DIR/<name>, Hub)
    and only its training split is read: validation and test sets come from `data` itself."""

    name: str | None = None  # label in logs, metrics and the cache; and where to find it (as data.name)
    src: str | None = None
    tgt: str | None = None
    local_dir: str | None = None  # e.g. a folder holding `mtrain translate` output (back-translation)
    format: DataFormat | None = None
    pattern: str | None = None  # as data.pattern, e.g. "synthetic.{lang}"
    split: str | None = None  # the split read for training; null: data.splits.train
    hub: HubConfig | None = None
    train_limit: int | None = ranged(None, at_least=1, why="(or null: data.train_limit)")
    # Share of the training draw: each epoch draws weight * size^(1/data.sampling_temperature)
    # pairs in proportion (1 everywhere and temperature 1: the corpora concatenated).
    weight: float = ranged(1.0, above=0, why="and finite (its share of the training draw)")
    # A reserved symbol <tag> starts every source sentence of this corpus, e.g. bt for
    # tagged back-translation (Caswell et al. 2019); null: no tag.
    tag: str | None = None

    def check(self, prefix: str) -> None:
        if self.tag is None:
            return
        symbol = f"<{self.tag}>"
        if not self.tag or any(character.isspace() or character in "<>" for character in self.tag):
            raise MtrainError(
                f"{prefix}.tag: {self.tag!r} must be a non-empty name without spaces or "
                "angle brackets (e.g. bt: the symbol <bt>)"
            )
        if symbol in SPECIAL_PIECES:
            raise MtrainError(
                f"{prefix}.tag: {self.tag!r} makes {symbol}, a special piece of the tokenizer; "
                "choose another name (e.g. bt)"
            )


# SentencePiece's own pieces: a tag must not be one of them.
SPECIAL_PIECES = ("<unk>", "<s>", "</s>", "<pad>")


@dataclass
class DataConfig:
    name: str = "multi30k"
    src: str = "de"
    tgt: str = "en"
    # Resolution order: local_dir, then $MTRAIN_DATA_DIR/<name>, then the Hub.
    local_dir: str | None = None
    format: DataFormat = DataFormat.text
    # File name per split and language; `.gz` is tried too. For tsv/jsonl the
    # {lang} placeholder is absent: "{split}.tsv".
    pattern: str = "{split}.{lang}"
    splits: SplitsConfig = field(default_factory=SplitsConfig)
    hub: HubConfig = field(default_factory=HubConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    subword_sampling: SubwordSamplingConfig = field(default_factory=SubwordSamplingConfig)
    # Keep only the first N training pairs (quick experiments and tests).
    train_limit: int | None = ranged(None, at_least=1)
    # What to do with a line that is not valid UTF-8: skip the pair and count it, or fail.
    invalid_utf8: InvalidUtf8 = InvalidUtf8.skip
    # Encoded corpora and tokenizers are cached here, keyed by data+settings hashes.
    cache_dir: str | None = None  # default: $MTRAIN_CACHE or ~/.cache/mtrain
    num_workers: int = ranged(1, at_least=1)  # processes for encoding during preparation
    chunk_size: int = ranged(100_000, at_least=1)  # pairs per preparation chunk
    # Several training corpora, each with its own source, direction, weight and tag (see
    # CorpusConfig); empty: the one corpus above. Validation and test sets are data's own, one
    # pair of them per direction the corpora train.
    corpora: list[CorpusConfig] = field(default_factory=list)
    # fairseq's --sampling-temperature: corpus i is drawn in proportion to
    # weight_i * size_i^(1/T); 1: by size (times weight), larger: flatter, towards uniform.
    sampling_temperature: float = ranged(
        1.0,
        above=0,
        why="and finite (1: draw in proportion to size times weight; larger: flatter, e.g. 100 for nearly uniform)",
    )
    # A target-language token <2xx> starts every source sentence (Johnson et al. 2017,
    # fairseq --encoder-langtok tgt): one model for several directions; translate tgt_lang=xx.
    lang_tags: bool = False

    def check(self, prefix: str) -> None:
        if len(self.corpora) > 1 and self.subword_sampling.alpha > 0:
            raise MtrainError(
                f"{prefix}.subword_sampling.alpha: subword sampling trains on one corpus; with several "
                f"{prefix}.corpora set it to 0"
            )


@dataclass
class TokenizerConfig:
    # An existing tokenizer instead of training one (fairseq's --srcdict, Marian's --vocabs): a run
    # directory, its tokenizer/ or a cache entry. The settings below are then those of its files.
    # With the tokenizer fixed, a corpus added to data.corpora is the only one encoded.
    path: str | None = None
    vocab_size: int = ranged(8000, at_least=5, why="(room for unk, pad, bos, eos and at least one piece)")
    model_type: TokenizerModel = TokenizerModel.unigram
    joint: bool = True  # one vocabulary for both languages
    character_coverage: float = ranged(1.0, above=0, at_most=1)
    max_sentences: int = ranged(2_000_000, at_least=1)  # SentencePiece samples at most this many sentences
    # SentencePiece training threads. The trained model depends on the count (its EM sums
    # per-thread counts), so it is a setting of its own, part of the tokenizer's cache key,
    # and not the machine's core count: the same config gives the same tokenizer everywhere.
    num_threads: int = ranged(1, at_least=1)
    # Explicit special ids (JoeyNMT/fairseq-compatible layout).
    unk_id: int = 0
    pad_id: int = 1
    bos_id: int = 2
    eos_id: int = 3

    def check(self, prefix: str) -> None:
        special = {name: getattr(self, name) for name in ("unk_id", "pad_id", "bos_id", "eos_id")}
        for name, value in special.items():
            if not 0 <= value < self.vocab_size:
                raise MtrainError(f"{prefix}.{name}: {value} must be in [0, {prefix}.vocab_size={self.vocab_size})")
        if len(set(special.values())) < len(special):
            raise MtrainError(
                f"{prefix}.unk_id/pad_id/bos_id/eos_id: {list(special.values())} must be four different ids"
            )


@dataclass
class ModelConfig:
    encoder_layers: int = ranged(3, at_least=1)
    decoder_layers: int = ranged(3, at_least=1)
    layers: int | None = ranged(None, at_least=1)  # sets both stacks when given (handy for sweeps)
    d_model: int = ranged(256, at_least=1)
    heads: int = ranged(4, at_least=1)
    ffn_dim: int = ranged(1024, at_least=1)
    activation: Activation = Activation.relu
    dropout: float = ranged(0.1, at_least=0, below=1)  # residual and embedding dropout
    attention_dropout: float = ranged(0.0, at_least=0, below=1)
    activation_dropout: float = ranged(0.0, at_least=0, below=1)
    norm_position: NormPosition = NormPosition.pre
    # What the pre-norm residual adds the sublayer's output to: the un-normalised stream x
    # (the standard: x + F(Norm(x))) or the normalised one (Norm(x) + F(Norm(x)); ablation).
    residual_input: ResidualInput = ResidualInput.raw
    norm_type: NormType = NormType.layernorm
    shared_norm: bool = False  # one norm shared by all sublayers of a layer (ablation)
    # A norm after the last layer of each stack; null: on with pre-norm, off with post-norm
    # (there the last sublayer already ends in a norm).
    final_norm: bool | None = None
    positions: Positions = Positions.sinusoidal
    max_positions: int = ranged(1024, at_least=1)
    # The first token's row of a sinusoidal table: M2M100/NLLB number positions from
    # pad_id + 1 (fairseq's make_positions), so an imported model reads rows 2, 3, ...
    position_offset: int = ranged(0, at_least=0)
    # Learned W_Q/W_K/W_V in cross-attention; false replaces one with the identity.
    cross_q_proj: bool = True
    cross_k_proj: bool = True
    cross_v_proj: bool = True
    detach_memory: bool = False  # stop gradients from reaching the encoder (ablation)
    decoder_order: DecoderOrder = DecoderOrder.self_cross_ffn
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model)
    tie_embeddings: bool = True  # source, target and output share one matrix (joint vocab)
    vocab_multiple: int = ranged(8, at_least=1)  # pad the vocabulary rows to a multiple (tensor-core shapes)
    output_bias: bool = False  # a trained bias added to the output logits (Marian's final_logits_bias)
    # Which pieces the output softmax ranges over. full: the whole target vocabulary. target:
    # the pieces that occur in the training targets (and eos, unk), fixed when training starts
    # and stored with the model: with a joint vocabulary about half the rows are source-only
    # pieces the decoder is never trained to emit (Multi30k de-en: 3,958 of 8,000), so the
    # output projection, its softmax and gradients cost half (see docs/PERFORMANCE.md).
    output_vocab: OutputVocab = OutputVocab.full
    # sdpa: torch's scaled_dot_product_attention; math: explicit matmul+softmax (faster on
    # CPU for the short sentences of small corpora); auto: measured choice per device.
    attention_impl: AttentionImpl = AttentionImpl.auto
    # A term-aware model (Dinu et al. 2019): sources may carry target terms after their words, told
    # apart by a source factor (mtrain/tokenizer/term_factors.py); trained with train.term_alignment,
    # and translate/eval/serve annotate the glossary's terms so (decode.term_mode). A fine-tune of a
    # plain model may turn it on (the factor embedding starts at zero).
    term_factors: bool = False

    @property
    def decoder_depth(self) -> int:
        """The decoder's layers: `layers` when set, else `decoder_layers`."""
        return self.decoder_layers if self.layers is None else self.layers

    def check(self, prefix: str) -> None:
        if self.residual_input == ResidualInput.normalized and self.norm_position != NormPosition.pre:
            raise MtrainError(
                f"{prefix}.residual_input: normalized needs {prefix}.norm_position=pre (post-norm's stream is "
                "normalised after every sublayer already)"
            )
        if self.d_model % self.heads:
            raise MtrainError(f"{prefix}.heads: {self.heads} does not divide {prefix}.d_model={self.d_model}")
        if self.positions == Positions.rope and (self.d_model // self.heads) % 2:
            raise MtrainError(
                f"{prefix}.positions: rope needs an even head size, got d_model/heads = {self.d_model // self.heads}"
            )
        if self.position_offset and self.positions not in (Positions.sinusoidal, Positions.sinusoidal_marian):
            raise MtrainError(
                f"{prefix}.position_offset={self.position_offset} shifts a sinusoidal table; "
                f"{prefix}.positions={Positions(self.positions).value} has none (set it to 0)"
            )


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
    num_threads: int | None = ranged(None, at_least=1)  # CPU intra-op threads of training (null: torch's default)
    # CPU threads of validation (its loss and its decode) and of the test decode (null: 1, as
    # translate and eval decode, whatever the load; mtrain/decode/threads.py): a test decode at
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
    resume: bool = False
    # With resume: continue from this checkpoint of the run (e.g. update_200) instead of last.
    resume_from: str | None = None
    # torch.compile the model and its loss (dynamic shapes: one graph for every batch shape).
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
        for name in ("max_time", "max_train_time"):
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


class TermPlacement(Choice):
    """Where a glossary term goes (mtrain/decode/placement.py): tied to its source word by the
    cross-attention (aligned), or wherever the constrained search puts it (none)."""

    aligned = "aligned"
    none = "none"


class TermMode(Choice):
    """How glossary terms reach the translation: hard constraints (the search must write them),
    annotation (a term-aware model reads them in its source: mtrain/tokenizer/term_factors.py),
    or both; auto: both on a term-aware model (model.term_factors), constraints on others."""

    auto = "auto"
    constraints = "constraints"
    annotation = "annotation"
    both = "both"


class AlignmentRule(Choice):
    """Which argmax of the attention matrix (target pieces x source pieces) makes a link."""

    source = "source"  # each source piece to the output piece attending to it most
    target = "target"  # each output piece to the source piece it attends to most (fairseq, Marian)
    union = "union"  # both


class AlignmentLevel(str, Enum):
    none = "none"
    word = "word"
    subword = "subword"


def alignment_level(value: object) -> AlignmentLevel:
    """`decode.alignment` as typed: true/word, subword, false/none/null."""
    text = "none" if value is None else str(value).strip().lower()
    text = {"true": "word", "false": "none", "null": "none", "": "none"}.get(text, text)
    try:
        return AlignmentLevel(text)
    except ValueError:
        raise MtrainError(f"decode.alignment={value}: choose true (= word), word, subword or false") from None


# The decoder layer word alignments read when decode.alignment_layer is null and the run trained
# no guided head (mtrain.decode.alignment): the penultimate, measured in docs/TRANSLATE.md.
DEFAULT_ALIGNMENT_LAYER = -2


@dataclass
class MbrConfig:
    """Minimum Bayes risk decoding (mtrain/decode/mbr.py): of `num_candidates` candidates, the one
    of highest mean `utility` against the pseudo-references."""

    candidates: MbrCandidates = MbrCandidates.none  # none: MBR off
    # At most 1,024: each candidate is scored against each pseudo-reference, so time and memory
    # grow with the square (10,000 took 47 s and 743 MB for one sentence; 1,024 is 1% of that)
    num_candidates: int = ranged(16, at_least=1, at_most=1024)
    # null: the candidates are their own pseudo-references; N: N more samples drawn for them (at most 1,024)
    num_pseudo_refs: int | None = ranged(None, at_least=1, at_most=1024)
    utility: MbrUtility = MbrUtility.chrf


@dataclass
class RerankConfig:
    """n-best reranking (mtrain/decode/rerank.py): a weighted sum of features per hypothesis."""

    weights: str | None = None  # a JSON weights file (scripts/tune_rerank.py); null: no reranking
    reverse_run: str | None = None  # a run of the opposite direction: log p(source | hypothesis)
    second_run: str | None = None  # another run of this direction: its log p(hypothesis | source)


@dataclass
class DecodeConfig:
    beam: int = ranged(5, at_least=1)
    length_penalty: float = 1.0  # alpha of length normalisation score / len**alpha
    max_len_a: float = ranged(1.5, at_least=0)  # max output length = a * source length + b
    max_len_b: int = ranged(10, at_least=0)
    min_len: int = ranged(1, at_least=0)
    nbest: int = ranged(1, at_least=1)
    max_tokens: int = ranged(8000, at_least=1)  # per decoding batch: sentences x beam x longest source
    no_repeat_ngram: int = ranged(0, at_least=0)
    sampling: Sampling = Sampling.none
    top_k: int = ranged(0, at_least=0, why="(0 samples from the whole vocabulary)")
    top_p: float = ranged(0.9, above=0, at_most=1)
    # sampling=epsilon: tokens of lower probability are never drawn
    epsilon: float = ranged(0.02, at_least=0, below=1, why="(0 samples from the whole vocabulary)")
    temperature: float = ranged(1.0, above=0)
    seed: int = ranged(1, at_least=0)  # sampling's random generator (same seed, same samples)
    # true: a sentence stops once `beam` hypotheses finished (fairseq); false: only once no
    # live hypothesis can beat them (exact bound, slower). See mtrain/decode/generator.py.
    early_stopping: bool = True
    valid_beam: int = ranged(1, at_least=1)  # beam used for validation BLEU during training (1 = greedy)
    # Word alignments of every output from cross-attention (mtrain/decode/alignment.py,
    # docs/TRANSLATE.md): false | true (= word) | word | subword.
    alignment: str = "false"
    # The decoder layer (negative: from the last) and head (null: the average of the heads)
    # the alignments come from; null layer: the run's guided head if it trained one, else -2
    # (engine=ctranslate2: -1, the only layer it exports).
    alignment_layer: int | None = None
    alignment_head: int | None = None
    # source: every source piece to the output piece attending to it most (the default: AER 36.3
    # against eflomal on the shared model, where fairseq's and Marian's `target` argmax has 45.5);
    # target: every output piece to the source piece it attends to most; union: both
    alignment_rule: AlignmentRule = AlignmentRule.source
    # Terms (terms=, a request's terms) placed where their source word is translated, the model's
    # usual word for it kept out, none after the final full stop: aligned | none (mtrain/decode/placement.py)
    term_placement: TermPlacement = TermPlacement.aligned
    # Terms as constraints, as annotation of the source (term-aware models), or both: auto | constraints | annotation | both
    term_mode: TermMode = TermMode.auto
    # A glossary's third field (`Hund<TAB>canine<TAB>dog|dogs`: the words a term replaces) avoided
    # in the translation of every sentence whose source holds the term (each also capitalised);
    # measured: the usual word stays beside a term in 0.8% of the matches instead of 13.9% (docs/TRANSLATE.md)
    term_avoid_replaced: bool = True
    mbr: MbrConfig = field(default_factory=MbrConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)

    # What a decode with these settings does, asked once here (mtrain.decoding_rules, mtrain.decode.selection).
    @property
    def uses_mbr(self) -> bool:
        return MbrCandidates(self.mbr.candidates) != MbrCandidates.none

    @property
    def uses_rerank(self) -> bool:
        return self.rerank.weights is not None

    @property
    def selects(self) -> bool:
        """The n-best is chosen by MBR or reranked (mtrain.decode.selection)."""
        return self.uses_mbr or self.uses_rerank

    @property
    def samples(self) -> bool:
        return Sampling(self.sampling) != Sampling.none

    @property
    def aligns(self) -> bool:
        """Every output gets word or subword alignments (`alignment` is not false)."""
        return alignment_level(self.alignment) is not AlignmentLevel.none

    @property
    def alignment_level(self) -> AlignmentLevel:
        return alignment_level(self.alignment)

    def check(self, prefix: str) -> None:
        if self.max_len_a == 0 and self.max_len_b == 0:
            raise MtrainError(
                f"{prefix}.max_len_a/max_len_b: both 0 allow no output token (max length = a * source + b)"
            )
        # (with MBR, beam and nbest are MBR's: mtrain.config_checks and mtrain.decode.mbr)
        if not self.uses_mbr and self.sampling == Sampling.none and self.nbest > self.beam:
            raise MtrainError(
                f"{prefix}.nbest: {self.nbest} is above {prefix}.beam={self.beam} (beam search "
                f"keeps only `beam` hypotheses); raise {prefix}.beam"
            )


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


def check_corpora(data: Any, tokenizer: Any) -> None:
    """data's values, data.corpora, data.sampling_temperature, data.lang_tags and the tags against
    the tokenizer: config nodes or the dataclasses (`prepare_data` checks library callers too)."""
    data, tokenizer = to_typed(data), to_typed(tokenizer)
    check_section(data, "data")
    corpora_rules(data, tokenizer)


def corpora_rules(data: DataConfig, tokenizer: TokenizerConfig) -> None:
    """The rules between data.corpora, data and the tokenizer (their own values are checked)."""
    lang_symbols = {f"<2{corpus.tgt or data.tgt}>" for corpus in data.corpora} | {f"<2{data.tgt}>"}
    directions = []
    for index, corpus in enumerate(data.corpora):
        name = f"data.corpora[{index}]"
        src, tgt = corpus.src or data.src, corpus.tgt or data.tgt
        if src == tgt:
            raise MtrainError(
                f"{name}.tgt: '{tgt}' is also its source language ({name}.src or data.src); "
                "a corpus translates between two languages"
            )
        if (src, tgt) not in directions:
            directions.append((src, tgt))
        if data.lang_tags and corpus.tag is not None and f"<{corpus.tag}>" in lang_symbols:
            raise MtrainError(
                f"{name}.tag: <{corpus.tag}> is also a target-language tag (data.lang_tags=true); choose another name"
            )
    ambiguous = source_with_several_targets(directions)
    if ambiguous is not None and not data.lang_tags:
        src, targets = ambiguous
        raise MtrainError(
            f"data.lang_tags: false, but data.corpora translates {src} into {' and '.join(targets)}: without "
            "a target-language tag the model cannot know which to write; set data.lang_tags=true (with "
            "tokenizer.joint=true)"
        )
    if data.lang_tags and not tokenizer.joint:
        raise MtrainError(
            "data.lang_tags: the language tags need one vocabulary for all languages; set tokenizer.joint=true"
        )
    if len(directions) > 1 and not tokenizer.joint:
        names = ", ".join(f"{src}-{tgt}" for src, tgt in directions)
        raise MtrainError(
            f"tokenizer.joint: false, but data.corpora trains {len(directions)} directions ({names}); "
            "several directions need tokenizer.joint=true"
        )
    tagged = data.lang_tags or any(corpus.tag for corpus in data.corpora)
    if data.subword_sampling.alpha > 0 and (len(data.corpora) > 1 or tagged):
        raise MtrainError(
            "data.subword_sampling.alpha: subword sampling works on one untagged training corpus; "
            "set it to 0 with several data.corpora, a corpus tag or data.lang_tags"
        )


def source_with_several_targets(directions: Sequence[tuple[str, str]]) -> tuple[str, list[str]] | None:
    """The first source language that `directions` translate into more than one language, with
    those languages; None when each source has one target. Without data.lang_tags such a run
    has nothing to tell it which of them to write."""
    for src, _ in directions:
        targets = [tgt for source, tgt in directions if source == src]
        if len(targets) > 1:
            return src, targets
    return None


@dataclass
class DecodingCommandConfig:
    """The keys of every command that decodes with a model: translate, eval and serve."""

    run: str | None = None  # a run directory written by `mtrain fit`, or an `mtrain export` directory (CTranslate2)
    checkpoint: str = "best"  # best | last | a path
    # Run directories or checkpoint files decoded together (mean of their log-probabilities at
    # every step); empty: run= alone. They must share run='s tokenizer.
    ensemble: list[str] = field(default_factory=list)
    weights: DecodeWeights = DecodeWeights.auto  # a checkpoint's EMA or trained weights
    engine: Engine = Engine.torch
    device: str = "auto"
    precision: str = "auto"  # torch: auto | fp32 | bf16 | fp16; ctranslate2: also its compute types (int8, ...)
    # CPU threads (null: 1, whatever the load; mtrain/decode/threads.py)
    num_threads: int | None = ranged(None, at_least=1)
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # (serve: the default of every request)
    # A glossary `source term<TAB>target term[<TAB>the words it replaces, |-separated]`: where a source
    # holds a source term, its target term is a constraint (translate's lines, eval's split, every
    # request of serve's two APIs; docs/TRANSLATE.md), placed by decode.term_placement
    terms: str | None = None
    terms_ignore_case: bool = False  # match the glossary's source terms ignoring case

    def check(self, prefix: str) -> None:
        if self.ensemble and self.engine != Engine.torch:
            raise MtrainError("ensemble: engine=ctranslate2 decodes one model; decode an ensemble with engine=torch")

    def _refuse_ensemble_without_run(self) -> None:
        first, others = self.ensemble[0], ",".join(self.ensemble[1:])
        raise MtrainError(
            "ensemble: decodes with run= (its tokenizer) and the members, and run= is missing: an ensemble "
            f"is written run=A ensemble=[B,...], here run={first}" + (f" ensemble=[{others}]" if others else "")
        )


@dataclass
class TranslateConfig(DecodingCommandConfig):
    input: str | None = None  # null: stdin
    output: str | None = None  # null: stdout
    # longer inputs are truncated with a warning
    max_input_tokens: int = ranged(1024, at_least=2, why="(one token and eos)")
    # A longer input line (input=, stdin, typed, prefix=) is refused, naming it, before it is held whole
    max_line_chars: int = ranged(DEFAULT_MAX_LINE_CHARS, at_least=1)
    attention: str | None = None  # directory for cross-attention heat maps
    attention_layer: str = "last"  # last | all | an index
    # Translate and flush each line as soon as it is read; null: when stdin is a terminal.
    interactive: bool | None = None
    # A multilingual run (lang_tags): the language to translate into; null: the run's own target language.
    tgt_lang: str | None = None
    # What the output must start with, contain or avoid (docs/TRANSLATE.md, "Prefixes and constraints"):
    prefix: str | None = None  # a file, one line per input line: each output starts with it (blank: none)
    constraints: ConstraintOrder = ConstraintOrder.none  # unordered|ordered: lines are `source<TAB>phrase...`
    avoid: str | None = None  # a file of phrases (one per line) no output may contain
    # text, or inline markup whose tags are taken out and put back by word alignments: xml | html
    # (mtrain/decode/markup.py, docs/TRANSLATE.md)
    format: str = "text"

    def check(self, prefix: str) -> None:
        super().check(prefix)
        if self.ensemble and not self.run:
            self._refuse_ensemble_without_run()
        layer = str(self.attention_layer)
        if layer not in ("last", "all") and not layer.lstrip("-").isdigit():
            raise MtrainError(f"attention_layer: {layer!r} must be last, all or a layer index")


@dataclass
class EvalConfig(DecodingCommandConfig):
    runs: str | None = None  # a sweep directory (or comma-separated run dirs) to compare
    split: EvalSplit = EvalSplit.test  # of the run's data config
    hyp: str | None = None
    ref: list[str] = field(default_factory=list)
    average_last: int = ranged(0, at_least=0)  # average the last N checkpoints before decoding
    # Where run= writes its report (<split>.json, .md, .hyp) and, with average_last, the averaged
    # checkpoint (average_lastN.pt); null: the run's eval/ and checkpoints/ (a read-only run needs out=)
    out: str | None = None
    metrics: list[str] = field(default_factory=lambda: ["bleu", "chrf", "ter"])
    # sacreBLEU's settings; other than these defaults, run='s report names them (eval/test.lc.json
    # for lowercase=true, test.tok-intl, test.chrf++) and leaves the default eval/test.* alone
    tokenize: str = "13a"
    lowercase: bool = False
    chrf_word_order: int = ranged(0, at_least=0)  # 2 gives chrF++
    baseline: str | None = None  # run to compare against with paired bootstrap
    bootstrap_samples: int = ranged(1000, at_least=0)
    # Per line: sentence-BLEU, chrF and the model's score, in <split>.sentences.tsv beside the report
    # (hyp=: <hyp file>.sentences.tsv beside it, or in out=; no model score)
    per_sentence: bool = False
    worst_lines: int = ranged(10, at_least=0)  # lines of lowest sentence-BLEU listed in the Markdown report
    # A multilingual run: the direction scored (its valid/test split); null: the run's own direction
    src_lang: str | None = None
    tgt_lang: str | None = None
    # (terms=: run= decodes with the glossary's terms as constraints; run= and hyp= report the
    # terminology metrics beside BLEU: exact-match accuracy, window overlap, 1-TERm, usual word kept beside)
    src: str | None = None  # hyp=: the sources of the hypotheses (where terms= finds its terms)
    # A longer line of hyp=, ref= or src= is refused, naming it, before it is held whole
    max_line_chars: int = ranged(DEFAULT_MAX_LINE_CHARS, at_least=1)

    def check(self, prefix: str) -> None:
        """An ensemble decodes with run= and reports to out=DIR, never into run='s eval/ (where it
        would pass for run='s own score); out= is where run= writes, and `hyp= per_sentence=true`
        its TSV: the other modes write nothing. runs= has no per-sentence scores."""
        super().check(prefix)
        self._check_terms()
        if self.ensemble:
            if not (self.run or self.runs or self.hyp):
                self._refuse_ensemble_without_run()
            if self.runs or self.hyp:
                raise MtrainError(
                    "ensemble: decodes with run=RUN's model; hyp= and runs= decode nothing "
                    "(drop ensemble=, or evaluate a run with run=RUN)"
                )
            if self.out is None:
                raise MtrainError(
                    f"ensemble: the report of an ensemble is not run={self.run}'s own; "
                    "give out=DIR to write it (and any average_last checkpoint) there"
                )
        if self.per_sentence and self.runs:
            raise MtrainError(
                "per_sentence: scores the lines of one run (run=) or file (hyp=), not a comparison "
                "(runs=); evaluate each run with run=RUN per_sentence=true"
            )
        if self.out is not None and (self.runs or (self.hyp and not self.per_sentence) or not (self.run or self.hyp)):
            raise MtrainError(
                "out: is where `mtrain eval run=RUN` writes its report (and hyp= per_sentence=true its "
                "sentence scores); hyp= alone and runs= write none (drop out=, or evaluate a run with "
                "run=RUN)"
            )

    def _check_terms(self) -> None:
        """terms= scores one run's split or one hypothesis file, whose sources it needs (src=, or
        run='s split); src= is hyp='s."""
        if self.terms is not None and self.runs:
            raise MtrainError(
                f"terms={self.terms}: scores one run (run=) or file (hyp=), not a comparison (runs=); "
                "evaluate each run with run=RUN terms=..."
            )
        if self.src is not None and not self.hyp:
            raise MtrainError(
                f"src={self.src}: the sources of a hypothesis file (hyp=); run= decodes its split's own sources"
            )
        if self.terms is not None and self.hyp and self.src is None and not self.run:
            raise MtrainError(
                f"terms={self.terms}: finds its terms in the sources of hyp={self.hyp}: give them as src=FILE "
                "(or run=RUN split=... for the split's)"
            )


@dataclass
class ServeConfig(DecodingCommandConfig):
    """`mtrain serve`: an HTTP JSON translation service (mtrain/cli/serve.py)."""

    # longer sentences are truncated with a warning, as translate does
    max_input_tokens: int = ranged(1024, at_least=2, why="(one token and eos)")
    # 127.0.0.1: this machine only; 0.0.0.0 (or an interface's address) serves the network.
    host: str = "127.0.0.1"
    port: int = ranged(8080, at_least=0, at_most=65535, why="(0: any free port)")
    # Sentences of concurrent requests decoded together: a batch closes at this many sentences
    # or once its oldest has waited max_wait_ms.
    max_batch_sentences: int = ranged(64, at_least=1)
    max_wait_ms: float = ranged(10.0, at_least=0)
    max_request_bytes: int = ranged(1_048_576, at_least=1)  # a larger body is refused (413)
    max_sentences: int = ranged(256, at_least=1)  # per request (413 above)
    max_sentence_chars: int = ranged(2000, at_least=1)  # per sentence (413 above)
    # a request not translated by then gets 504, and its decode stops at its next step
    request_timeout_s: float = ranged(60.0, above=0)
    # What a constrained search may cost (docs/SERVE.md; 413 above): constraints in one
    # sentence (its own and the terms found in it), and source tokens x constraints summed
    # over a request's sentences.
    max_sentence_constraints: int = ranged(32, at_least=1)
    max_constrained_work: int = ranged(16384, at_least=1)
    max_beam: int = ranged(10, at_least=1)  # the largest beam (and nbest) a request may ask for (422 above)
    # A request's head, and then its body, must each arrive within this many seconds (else 408
    # and the connection is closed: a client sending slowly holds no connection for long).
    read_timeout_s: float = ranged(20.0, above=0)
    max_connections: int = ranged(512, at_least=1)  # open connections at once; one more is answered 503 and closed
    access_log: bool = True  # one log line per request: method, path, status, sentences, milliseconds
    # Who may translate (both APIs' POST /translate; docs/LIBRETRANSLATE.md). Off by default.
    api_keys_file: str | None = None  # one key per line (# comments): a request without one of them gets 403
    # requests per minute per API key, else per client address (429 above); 0: off
    rate_limit_per_minute: int = ranged(0, at_least=0)
    # Behind a reverse proxy (docs/SERVE.md). A client's address is the socket's, unless the
    # peer is one of these proxies (addresses or networks: [127.0.0.1, 10.0.0.0/8]): then X-Forwarded-For's.
    trusted_proxies: list[str] = field(default_factory=list)
    # Host names clients may reach the server by (others get 400: DNS rebinding); "*": any.
    # null: localhost, 127.0.0.1 and ::1 when bound to a loopback address, any otherwise.
    allowed_hosts: list[str] | None = None
    # Web origins whose pages may call both APIs from a browser (CORS; "*": any); []: none.
    cors_origins: list[str] = field(default_factory=list)

    def check(self, prefix: str) -> None:
        super().check(prefix)
        for name in ("beam", "nbest"):
            value = getattr(self.decode, name)
            if value > self.max_beam:
                raise MtrainError(
                    f"max_beam: {self.max_beam} is below decode.{name}={value}, the default of "
                    f"every request; raise max_beam or lower decode.{name}"
                )


@dataclass
class AverageConfig:
    run: str | None = None  # average the last `last` update_<N>.pt checkpoints of this run
    last: int = ranged(3, at_least=1)  # what train.keep_last keeps by default
    checkpoints: list[str] = field(default_factory=list)  # or exactly these files
    out: str | None = None  # default: <run>/checkpoints/average_last<N>.pt
    force: bool = False  # replace an existing `out` (never a run's last.pt, best.pt or update_<N>.pt)


@dataclass
class ReportConfig:
    sweep: str | None = None  # a sweep directory or comma-separated run dirs (`mtrain report DIR`)
    out: str | None = None  # default: <sweep>/report
    # Paired bootstrap of every run's saved test hypotheses against a baseline (default: the
    # first run), as in `mtrain eval runs=...`; 0 resamples leaves the columns out.
    baseline: str | None = None
    bootstrap_samples: int = ranged(1000, at_least=0, why="(0 leaves the bootstrap columns out)")


@dataclass
class ExportConfig:
    run: str | None = None  # a run directory written by `mtrain fit`
    checkpoint: str = "best"  # best | last | a path
    format: ExportFormat = ExportFormat.ctranslate2
    out: str | None = None  # the model directory to write (format=argos: the FILE.argosmodel)
    # format=ctranslate2 and argos (CTranslate2's weights): null (fp32) | int8 | int8_float16 | int16 |
    # float16 | bfloat16 ...; format=hf writes float32 only
    quantization: str | None = None
    force: bool = False  # replace `out` only when it is an earlier `mtrain export` (of any format), never anything else
    weights: DecodeWeights = DecodeWeights.auto  # a checkpoint's EMA or trained weights
    score: bool = True  # format=argos: print the BLEU of the package's decoding on the run's test split


# The schema of each command's config, by config name (configs/<name>.yaml).
APP_SCHEMAS = {
    "fit": FitConfig,
    "prepare": FitConfig,
    "translate": TranslateConfig,
    "serve": ServeConfig,
    "eval": EvalConfig,
    "average": AverageConfig,
    "report": ReportConfig,
    "export": ExportConfig,
}


def register_configs() -> None:
    """Register the schemas so YAML files in configs/ are validated against them."""
    # Imported here, not above: the data layer's typed signatures import this module, and
    # encoding worker processes should not pay Hydra's import (0.2 s) for them.
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="fit_schema", node=FitConfig)
    cs.store(name="translate_schema", node=TranslateConfig)
    cs.store(name="serve_schema", node=ServeConfig)
    cs.store(name="eval_schema", node=EvalConfig)
    cs.store(name="average_schema", node=AverageConfig)
    cs.store(name="report_schema", node=ReportConfig)
    cs.store(name="export_schema", node=ExportConfig)
    cs.store(group="data", name="data_schema", node=DataConfig)
    cs.store(group="tokenizer", name="tokenizer_schema", node=TokenizerConfig)
    cs.store(group="model", name="model_schema", node=ModelConfig)
    cs.store(group="train", name="train_schema", node=TrainConfig)
    cs.store(group="decode", name="decode_schema", node=DecodeConfig)


def to_plain(cfg: Any) -> Any:
    """A config (OmegaConf node or config dataclass) as plain Python containers, for
    checkpoints, JSON reports and cache keys; choices become plain strings, so a checkpoint
    holding it still loads with torch.load(weights_only=True). Anything else is returned as is."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        cfg = OmegaConf.structured(cfg)
    if OmegaConf.is_config(cfg):
        return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    return cfg


def to_typed(cfg: Any) -> Any:
    """A composed config (or section) as its dataclass, what library functions take; choices
    become their Enum members. A config dataclass is returned as it is."""
    if OmegaConf.is_config(cfg):
        return OmegaConf.to_object(cfg)
    return cfg


def with_values(section: Any, **values: Any) -> Any:
    """A copy of a config section (a config dataclass or an OmegaConf node) with `values` changed."""
    if dataclasses.is_dataclass(section) and not isinstance(section, type):
        return dataclasses.replace(section, **values)
    return OmegaConf.merge(section, values)


def resolved_model(cfg: Any) -> ModelConfig:
    """The model as it is built, with the derived values made explicit: `layers` (when set)
    copied to both stacks, and `final_norm` null (auto) decided: on with pre-norm, off with
    post-norm (whose last sublayer already ends in a norm).

    `cfg`: a ModelConfig, or a DictConfig/dict of its keys. The input is not changed;
    resolving a resolved config changes nothing.
    """
    if not isinstance(cfg, ModelConfig):
        cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), cfg))
    assert isinstance(cfg, ModelConfig)  # to_object of a ModelConfig node builds the dataclass
    layers = cfg.layers
    final_norm = cfg.final_norm if cfg.final_norm is not None else cfg.norm_position == NormPosition.pre
    return dataclasses.replace(
        cfg,
        encoder_layers=cfg.encoder_layers if layers is None else layers,
        decoder_layers=cfg.decoder_layers if layers is None else layers,
        final_norm=final_norm,
    )


def with_resolved_model(cfg: FitConfig) -> FitConfig:
    """A copy of a FitConfig (or its composed node) as the dataclass, whose `model` section says
    what is built (see resolved_model), for what a run records (config.yaml, checkpoints);
    `cfg` itself is left as composed."""
    typed: FitConfig = to_typed(cfg)
    return dataclasses.replace(typed, model=resolved_model(typed.model))


def check_model_config(cfg: Any, prefix: str = "model") -> None:
    """Raise MtrainError("model.<key>: ...") for the first invalid value of a ModelConfig (or
    its node): `build_model` checks library callers with it, before any tensor is allocated."""
    _check_choices(cfg, ModelConfig, prefix)
    check_section(to_typed(cfg) if OmegaConf.is_config(cfg) else cfg, prefix)


def _check_choices(section: Any, schema: type, prefix: str) -> None:
    """Choice fields hold one of their values. OmegaConf enforces this for a composed config;
    a dataclass built in code (a library caller, a test) is checked here."""
    import typing

    from mtrain.config_names import did_you_mean

    for name, field_type in typing.get_type_hints(schema).items():
        choice = next(
            (t for t in (field_type, *typing.get_args(field_type)) if isinstance(t, type) and issubclass(t, Enum)), None
        )
        value = getattr(section, name)
        if choice is not None and value is not None and value not in {member.value for member in choice}:
            allowed = [member.value for member in choice]
            raise MtrainError(
                f"{prefix}.{name}: {value!r} is not one of {'|'.join(allowed)}" + did_you_mean(str(value), allowed)
            )
