"""`decode:` (configs/decode/): the search, sampling, MBR, reranking, word alignments and terms
of every decode, and which of a checkpoint's weights decode."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from mtrain.config.choice import Choice
from mtrain.config_fields import ranged
from mtrain.errors import MtrainError


class Sampling(Choice):
    none = "none"
    topk = "topk"
    topp = "topp"
    epsilon = "epsilon"  # tokens of probability below decode.epsilon cut (Hewitt et al. 2022)


class MbrCandidates(Choice):
    """Where MBR decoding's candidates come from (mtrain/decode/selection/mbr.py); none: no MBR."""

    none = "none"
    beam = "beam"  # the beam's n-best (beam = nbest = num_candidates)
    sample = "sample"  # num_candidates samples (decode.sampling; none means epsilon)
    both = "both"  # half from the beam (rounded up), the rest sampled


class MbrUtility(Choice):
    chrf = "chrf"  # sacreBLEU's sentence chrF (chrF2, character 6-grams)
    bleu = "bleu"  # sacreBLEU's sentence BLEU (exp smoothing, effective order)


class DecodeWeights(Choice):
    """Which of a checkpoint's weights decode: auto is the EMA weights when the run kept them
    (train.ema_decay), else the trained ones; raw always the trained ones."""

    auto = "auto"
    ema = "ema"
    raw = "raw"


class TermPlacement(Choice):
    """Where a glossary term goes (mtrain/decode/search/placement.py): tied to its source word by the
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
# no guided head (mtrain.decode.translation.alignment): the penultimate, measured in docs/TRANSLATE.md.
DEFAULT_ALIGNMENT_LAYER = -2


@dataclass
class MbrConfig:
    """Minimum Bayes risk decoding (mtrain/decode/selection/mbr.py): of `num_candidates` candidates, the one
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
    """n-best reranking (mtrain/decode/selection/rerank.py): a weighted sum of features per hypothesis."""

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
    # live hypothesis can beat them (exact bound, slower). See mtrain/decode/search/generator.py.
    early_stopping: bool = True
    valid_beam: int = ranged(1, at_least=1)  # beam used for validation BLEU during training (1 = greedy)
    # Word alignments of every output from cross-attention (mtrain/decode/translation/alignment.py,
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
    # usual word for it kept out, none after the final full stop: aligned | none (mtrain/decode/search/placement.py)
    term_placement: TermPlacement = TermPlacement.aligned
    # Terms as constraints, as annotation of the source (term-aware models), or both: auto | constraints | annotation | both
    term_mode: TermMode = TermMode.auto
    # A glossary's third field (`Hund<TAB>canine<TAB>dog|dogs`: the words a term replaces) avoided
    # in the translation of every sentence whose source holds the term (each also capitalised);
    # measured: the usual word stays beside a term in 0.8% of the matches instead of 13.9% (docs/TRANSLATE.md)
    term_avoid_replaced: bool = True
    mbr: MbrConfig = field(default_factory=MbrConfig)
    rerank: RerankConfig = field(default_factory=RerankConfig)

    # What a decode with these settings does, asked once here (mtrain.decoding_rules, mtrain.decode.selection.selecting).
    @property
    def uses_mbr(self) -> bool:
        return MbrCandidates(self.mbr.candidates) != MbrCandidates.none

    @property
    def uses_rerank(self) -> bool:
        return self.rerank.weights is not None

    @property
    def selects(self) -> bool:
        """The n-best is chosen by MBR or reranked (mtrain.decode.selection.selecting)."""
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
        # (nbest against the beam or MBR's candidates: mtrain.decoding_rules.check_nbest, which
        # the config checks and serve's requests both call)
