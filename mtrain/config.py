"""Typed configuration for every mtrain command, registered in Hydra's ConfigStore.

The YAML files under `configs/` only set values, and only those that differ from the
defaults here; the dataclasses define which keys exist, their types and, for choices, their
allowed values (`Choice` enums), so a typo (`model.d_modle=512`), a wrong type
(`train.lr=fast`) or an unknown choice (`model.activation=rleu`) fails at composition time,
naming the key, before any work starts. Value ranges are checked in mtrain.config_checks.

Config groups mirror the package: `data/` -> mtrain.data, `tokenizer/` ->
mtrain.tokenizer, `model/` -> mtrain.model, `train/` -> mtrain.train,
`decode/` -> mtrain.decode; `experiment/` presets combine them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import OmegaConf

from mtrain.errors import MtrainError


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

    max_len: int = 256  # subword tokens per side
    min_len: int = 1
    max_len_ratio: float = 3.0  # longer/shorter side, in subword tokens
    drop_identical: bool = False
    deduplicate: bool = False
    normalize: Normalization | None = None
    # Drop training pairs whose source side also occurs in the validation or test split
    # (they are counted and logged either way; metrics.json records the counts).
    drop_eval_overlap: bool = False


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
    train_limit: int | None = None
    # Share of the training draw: each epoch draws weight * size^(1/data.sampling_temperature)
    # pairs in proportion (1 everywhere and temperature 1: the corpora concatenated).
    weight: float = 1.0
    # A reserved symbol <tag> starts every source sentence of this corpus, e.g. bt for
    # tagged back-translation (Caswell et al. 2019); null: no tag.
    tag: str | None = None


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
    train_limit: int | None = None
    # What to do with a line that is not valid UTF-8: skip the pair and count it, or fail.
    invalid_utf8: InvalidUtf8 = InvalidUtf8.skip
    # Encoded corpora and tokenizers are cached here, keyed by data+settings hashes.
    cache_dir: str | None = None  # default: $MTRAIN_CACHE or ~/.cache/mtrain
    num_workers: int = 1  # processes for encoding during preparation
    chunk_size: int = 100_000  # pairs per preparation chunk
    # Several training corpora, each with its own source, direction, weight and tag (see
    # CorpusConfig); empty: the one corpus above. Validation and test sets are data's own, one
    # pair of them per direction the corpora train.
    corpora: list[CorpusConfig] = field(default_factory=list)
    # fairseq's --sampling-temperature: corpus i is drawn in proportion to
    # weight_i * size_i^(1/T); 1: by size (times weight), larger: flatter, towards uniform.
    sampling_temperature: float = 1.0
    # A target-language token <2xx> starts every source sentence (Johnson et al. 2017,
    # fairseq --encoder-langtok tgt): one model for several directions; translate tgt_lang=xx.
    lang_tags: bool = False


@dataclass
class TokenizerConfig:
    # An existing tokenizer instead of training one (fairseq's --srcdict, Marian's --vocabs): a run
    # directory, its tokenizer/ or a cache entry. The settings below are then those of its files.
    # With the tokenizer fixed, a corpus added to data.corpora is the only one encoded.
    path: str | None = None
    vocab_size: int = 8000
    model_type: TokenizerModel = TokenizerModel.unigram
    joint: bool = True  # one vocabulary for both languages
    character_coverage: float = 1.0
    max_sentences: int = 2_000_000  # SentencePiece samples at most this many sentences
    # SentencePiece training threads. The trained model depends on the count (its EM sums
    # per-thread counts), so it is a setting of its own, part of the tokenizer's cache key,
    # and not the machine's core count: the same config gives the same tokenizer everywhere.
    num_threads: int = 1
    # Explicit special ids (JoeyNMT/fairseq-compatible layout).
    unk_id: int = 0
    pad_id: int = 1
    bos_id: int = 2
    eos_id: int = 3


@dataclass
class ModelConfig:
    encoder_layers: int = 3
    decoder_layers: int = 3
    layers: int | None = None  # sets both stacks when given (handy for sweeps)
    d_model: int = 256
    heads: int = 4
    ffn_dim: int = 1024
    activation: Activation = Activation.relu
    dropout: float = 0.1  # residual and embedding dropout
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
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
    max_positions: int = 1024
    # Learned W_Q/W_K/W_V in cross-attention; false replaces one with the identity.
    cross_q_proj: bool = True
    cross_k_proj: bool = True
    cross_v_proj: bool = True
    detach_memory: bool = False  # stop gradients from reaching the encoder (ablation)
    decoder_order: DecoderOrder = DecoderOrder.self_cross_ffn
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model)
    tie_embeddings: bool = True  # source, target and output share one matrix (joint vocab)
    vocab_multiple: int = 8  # pad the vocabulary rows to a multiple (tensor-core shapes)
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


@dataclass
class TrainConfig:
    max_tokens: int = 4096  # per batch: sentences x padded length of the longer side
    update_freq: int = 1  # gradient accumulation steps per update
    lr: float = 5e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-8
    weight_decay: float = 0.0
    scheduler: Scheduler = Scheduler.inverse_sqrt
    warmup_updates: int = 4000
    min_lr: float = 0.0
    # Horizon of cosine/linear decay, in updates. When null and a time budget is set (max_time
    # or max_train_time), the decay follows elapsed training time instead (ends with training).
    decay_updates: int | None = None
    clip_norm: float = 1.0  # 0 disables
    label_smoothing: float = 0.1
    max_updates: int | None = None
    max_epochs: int | None = None
    # The wall time of the whole run ("90s", "20m", "2h"): preparation, training, validations,
    # checkpoints and the test decode. Training gets what is left once the time spent before it
    # and the estimated cost of the last validation and the test decode are set aside
    # (mtrain/train/budget.py); the learning-rate schedule follows that share.
    max_time: str | None = None
    # The training clock alone (updates; validation, checkpoints and the test come on top), as
    # a benchmark compares toolkits; with max_time, the smaller of the two governs.
    max_train_time: str | None = None
    patience: int | None = None  # validations without a val-BLEU gain before stopping
    precision: Precision = Precision.auto
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    num_threads: int | None = None  # CPU intra-op threads of training (null: torch's default)
    # CPU threads of validation (its loss and its decode) and of the test decode (null: 1, as
    # translate and eval decode, whatever the load; mtrain/decode/threads.py): a test decode at
    # train.num_threads=2 on busy cores ran 5x slower than `mtrain eval` on the same checkpoint.
    decode_num_threads: int | None = None
    validate_every: int = 1000
    # Also validate (and checkpoint) every this much training time ("2m"); null: by updates only.
    validate_every_time: str | None = None
    valid_bleu: bool = True
    valid_max_sentences: int | None = None
    log_every: int = 50
    # Also log at least this often ("30s"), whichever comes first: a training line however slow
    # the updates, and the progress of the validation and test decodes; null: by updates only.
    log_every_time: str | None = "30s"
    keep_last: int = 3  # update_N.pt checkpoints kept besides last/best
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
    max_bad_updates: int = 5  # consecutive non-finite updates before aborting
    max_oom_batches: int = 5  # consecutive out-of-memory batches before aborting
    instruments: bool = False  # per-layer statistics to TensorBoard (ablation bench)
    instrument_every: int = 100
    # Warmup as a share of the training time ("9%": of max_train_time, or of max_time's training
    # share) or a duration ("60s"), so the learning-rate curve has the same shape on a slow
    # machine as on a fast one. Used only with a time budget, and then instead of warmup_updates
    # (see mtrain/train/schedule.py).
    warmup_time: str | None = None
    # Round training batches' src/tgt lengths up to a multiple of this (1: no rounding), which
    # bounds the number of batch shapes per epoch (torch.compile, allocator, oneDNN's buffers);
    # mtrain/batches/batching.py. null: 8 on CUDA, 4 for bf16 on a CPU (less memory, as fast),
    # 1 for fp32 on a CPU (there padding costs its FLOPs: -5%). docs/PERFORMANCE.md.
    pad_to_multiple: int | None = None
    # Pad every training batch to one of at most this many shapes: both sides to one of this
    # many widths chosen from the corpus's lengths (least padding), one row count per width
    # (mtrain/batches/buckets.py); 0: off. null: 8 when compiling (train.compile or
    # train.cuda_graphs: a CUDA graph per shape), else off (on a CPU padding costs its FLOPs).
    shape_buckets: int | None = None
    # Exponential moving average of the weights (fairseq --ema-decay, Marian
    # --exponential-smoothing), e.g. 0.999; null: none. When on, validation, best.pt and the
    # test decode use the averaged weights (mtrain/train/ema.py).
    ema_decay: float | None = None
    ema_start_update: int = 0  # before this update the average follows the weights exactly
    # Guided alignment (Garg et al. 2019; Marian's --guided-alignment): a Pharaoh file of word
    # alignments, line for line with the training corpus (scripts/align_eflomal.py); one
    # cross-attention head is trained towards them (mtrain/batches/guided_alignment.py). null: off.
    guided_alignment: str | None = None
    guided_alignment_weight: float = 0.1  # of the alignment cross-entropy beside the translation loss
    guided_alignment_layer: int = -2  # the decoder layer (negative: from the last): Garg's penultimate
    guided_alignment_head: int = 0  # the head of that layer that is guided


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


@dataclass
class MbrConfig:
    """Minimum Bayes risk decoding (mtrain/decode/mbr.py): of `num_candidates` candidates, the one
    of highest mean `utility` against the pseudo-references."""

    candidates: MbrCandidates = MbrCandidates.none  # none: MBR off
    num_candidates: int = 16
    # null: the candidates are their own pseudo-references; N: N more samples drawn for them
    num_pseudo_refs: int | None = None
    utility: MbrUtility = MbrUtility.chrf


@dataclass
class RerankConfig:
    """n-best reranking (mtrain/decode/rerank.py): a weighted sum of features per hypothesis."""

    weights: str | None = None  # a JSON weights file (scripts/tune_rerank.py); null: no reranking
    reverse_run: str | None = None  # a run of the opposite direction: log p(source | hypothesis)
    second_run: str | None = None  # another run of this direction: its log p(hypothesis | source)


@dataclass
class DecodeConfig:
    beam: int = 5
    length_penalty: float = 1.0  # alpha of length normalisation score / len**alpha
    max_len_a: float = 1.5  # max output length = a * source length + b
    max_len_b: int = 10
    min_len: int = 1
    nbest: int = 1
    max_tokens: int = 8000  # per decoding batch: sentences x beam x longest source
    no_repeat_ngram: int = 0
    sampling: Sampling = Sampling.none
    top_k: int = 0
    top_p: float = 0.9
    epsilon: float = 0.02  # sampling=epsilon: tokens of lower probability are never drawn
    temperature: float = 1.0
    seed: int = 1  # sampling's random generator (same seed, same samples)
    # true: a sentence stops once `beam` hypotheses finished (fairseq); false: only once no
    # live hypothesis can beat them (exact bound, slower). See mtrain/decode/generator.py.
    early_stopping: bool = True
    valid_beam: int = 1  # beam used for validation BLEU during training (1 = greedy)
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
    mbr: MbrConfig = field(default_factory=MbrConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)


@dataclass
class FitConfig:
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    seed: int = 1
    # Start a new run from another run's weights (a run directory: its best.pt; or a checkpoint
    # file; or a Hugging Face model directory or hub id: docs/FINETUNE.md) and reuse its tokenizer:
    # fine-tuning, continued training, domain adaptation. Unlike train.resume, the data, schedule
    # and optimiser are this run's own.
    init_from: str | None = None
    init_weights: DecodeWeights = DecodeWeights.auto  # the parent's EMA or trained weights
    init_keep_optimizer: bool = False  # also take the parent's Adam moments (last.pt holds them)


@dataclass
class TranslateConfig:
    run: str | None = None  # a run directory written by `mtrain fit`
    checkpoint: str = "best"  # best | last | a path
    input: str | None = None  # null: stdin
    output: str | None = None  # null: stdout
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = "auto"
    precision: str = "auto"  # torch: auto | fp32 | bf16 | fp16; ctranslate2: also its compute types (int8, ...)
    num_threads: int | None = None  # CPU threads (null: 1, whatever the load; mtrain/decode/threads.py)
    max_input_tokens: int = 1024  # longer inputs are truncated with a warning
    attention: str | None = None  # directory for cross-attention heat maps
    attention_layer: str = "last"  # last | all | an index
    engine: Engine = Engine.torch
    # Run directories or checkpoint files decoded together (mean of their log-probabilities at
    # every step); empty: run= alone. They must share run='s tokenizer.
    ensemble: list[str] = field(default_factory=list)
    weights: DecodeWeights = DecodeWeights.auto  # a checkpoint's EMA or trained weights
    # Translate and flush each line as soon as it is read; null: when stdin is a terminal.
    interactive: bool | None = None
    # A multilingual run (lang_tags): the language to translate into; null: the run's own target language.
    tgt_lang: str | None = None
    # What the output must start with, contain or avoid (docs/TRANSLATE.md, "Prefixes and constraints"):
    prefix: str | None = None  # a file, one line per input line: each output starts with it (blank: none)
    constraints: ConstraintOrder = ConstraintOrder.none  # unordered|ordered: lines are `source<TAB>phrase...`
    terms: str | None = None  # a glossary `source term<TAB>target term`: found source terms -> constraints
    terms_ignore_case: bool = False  # match the glossary's source terms ignoring case
    avoid: str | None = None  # a file of phrases (one per line) no output may contain
    # text, or inline markup whose tags are taken out and put back by word alignments: xml | html
    # (mtrain/decode/markup.py, docs/TRANSLATE.md)
    format: str = "text"


@dataclass
class EvalConfig:
    run: str | None = None
    runs: str | None = None  # a sweep directory (or comma-separated run dirs) to compare
    split: EvalSplit = EvalSplit.test  # of the run's data config
    hyp: str | None = None
    ref: list[str] = field(default_factory=list)
    checkpoint: str = "best"
    average_last: int = 0  # average the last N checkpoints before decoding
    # Where run= writes its report (<split>.json, .md, .hyp) and, with average_last, the averaged
    # checkpoint (average_lastN.pt); null: the run's eval/ and checkpoints/ (a read-only run needs out=)
    out: str | None = None
    metrics: list[str] = field(default_factory=lambda: ["bleu", "chrf", "ter"])
    # sacreBLEU's settings; other than these defaults, run='s report names them (eval/test.lc.json
    # for lowercase=true, test.tok-intl, test.chrf++) and leaves the default eval/test.* alone
    tokenize: str = "13a"
    lowercase: bool = False
    chrf_word_order: int = 0  # 2 gives chrF++
    baseline: str | None = None  # run to compare against with paired bootstrap
    bootstrap_samples: int = 1000
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    device: str = "auto"
    precision: str = "auto"  # as translate's
    num_threads: int | None = None  # CPU threads (null: 1, whatever the load; mtrain/decode/threads.py)
    engine: Engine = Engine.torch
    ensemble: list[str] = field(default_factory=list)  # as translate's
    weights: DecodeWeights = DecodeWeights.auto
    # Per line: sentence-BLEU, chrF and the model's score, in <split>.sentences.tsv beside the report
    # (hyp=: <hyp file>.sentences.tsv beside it, or in out=; no model score)
    per_sentence: bool = False
    worst_lines: int = 10  # lines of lowest sentence-BLEU listed in the Markdown report
    # A multilingual run: the direction scored (its valid/test split); null: the run's own direction
    src_lang: str | None = None
    tgt_lang: str | None = None


@dataclass
class ServeConfig:
    """`mtrain serve`: an HTTP JSON translation service (mtrain/cli/serve.py)."""

    run: str | None = None  # a run directory of `mtrain fit`, or an `mtrain export` directory (engine=ctranslate2)
    checkpoint: str = "best"  # best | last | a path
    ensemble: list[str] = field(default_factory=list)  # as translate's
    weights: DecodeWeights = DecodeWeights.auto  # as translate's
    engine: Engine = Engine.torch
    device: str = "auto"
    precision: str = "auto"  # as translate's
    num_threads: int | None = None  # CPU threads (null: 1, whatever the load; mtrain/decode/threads.py)
    decode: DecodeConfig = field(default_factory=DecodeConfig)  # the default of every request
    max_input_tokens: int = 1024  # longer sentences are truncated with a warning, as translate does
    # 127.0.0.1: this machine only; 0.0.0.0 (or an interface's address) serves the network.
    host: str = "127.0.0.1"
    port: int = 8080
    # Sentences of concurrent requests decoded together: a batch closes at this many sentences
    # or once its oldest has waited max_wait_ms.
    max_batch_sentences: int = 64
    max_wait_ms: float = 10.0
    max_request_bytes: int = 1_048_576  # a larger body is refused (413)
    max_sentences: int = 256  # per request (413 above)
    max_sentence_chars: int = 2000  # per sentence (413 above)
    request_timeout_s: float = 60.0  # a request not translated by then gets 504
    max_beam: int = 10  # the largest beam (and nbest) a request may ask for (422 above)
    # A request's head, and then its body, must each arrive within this many seconds (else 408
    # and the connection is closed: a client sending slowly holds no connection for long).
    read_timeout_s: float = 20.0
    max_connections: int = 512  # open connections at once; one more is answered 503 and closed
    access_log: bool = True  # one log line per request: method, path, status, sentences, milliseconds
    # Who may translate (both APIs' POST /translate; docs/LIBRETRANSLATE.md). Off by default.
    api_keys_file: str | None = None  # one key per line (# comments): a request without one of them gets 403
    rate_limit_per_minute: int = 0  # requests per minute per API key, else per client address (429 above); 0: off


@dataclass
class AverageConfig:
    run: str | None = None  # average the last `last` update_<N>.pt checkpoints of this run
    last: int = 3  # what train.keep_last keeps by default
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
    bootstrap_samples: int = 1000


@dataclass
class ExportConfig:
    run: str | None = None  # a run directory written by `mtrain fit`
    checkpoint: str = "best"  # best | last | a path
    format: ExportFormat = ExportFormat.ctranslate2
    out: str | None = None  # the model directory to write (format=argos: the FILE.argosmodel)
    # format=ctranslate2 only: null (fp32) | int8 | int8_float16 | int16 | float16 | bfloat16 ...
    quantization: str | None = None
    force: bool = False  # replace an existing `out`
    weights: DecodeWeights = DecodeWeights.auto  # a checkpoint's EMA or trained weights


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
