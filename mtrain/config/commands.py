"""The configs of the commands that use a run (configs/<command>.yaml): translate, eval and serve
(which decode with a model: `DecodingCommandConfig`), average, report and export."""

from __future__ import annotations

from dataclasses import dataclass, field

from mtrain.config.choice import Choice
from mtrain.config.decode import DecodeConfig, DecodeWeights
from mtrain.config_fields import ranged
from mtrain.errors import MtrainError

# translate's and eval's max_line_chars: a long paragraph is some thousands; a megabyte is no sentence
DEFAULT_MAX_LINE_CHARS = 200_000


class ConstraintOrder(Choice):
    """`mtrain translate constraints=`: whether input lines carry constraints (fairseq's format)."""

    none = "none"  # a line is the source (a tab in it is part of the source)
    unordered = "unordered"  # `source<TAB>phrase<TAB>...`: each phrase somewhere in the output
    ordered = "ordered"  # the same, the phrases in their order


class Engine(Choice):
    torch = "torch"
    ctranslate2 = "ctranslate2"


class EvalSplit(Choice):
    valid = "valid"
    test = "test"


class ExportFormat(Choice):
    ctranslate2 = "ctranslate2"
    argos = "argos"  # an Argos Translate package, out=FILE.argosmodel (mtrain/export/argos.py)
    hf = "hf"  # a transformers model directory (mtrain.export.hf_model)


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
    tf32: bool = True  # CUDA, engine=torch: fp32 matrix products on TF32 tensor cores (false: full fp32)
    # CPU threads (null: 1, whatever the load; mtrain/decode/engines/threads.py)
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
    # (mtrain/decode/requests/markup.py, docs/TRANSLATE.md)
    format: str = "text"
    # A column after each translation: its confidence score in [0, 1], empty for a blank line
    # (mtrain/decode/translation/confidence.py; docs/TRANSLATE.md, "Confidence scores")
    confidence: bool = False

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
