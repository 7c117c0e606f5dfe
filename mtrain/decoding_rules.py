"""Which decoding features combine: every rule, in one place, in one wording.

A decode is its settings (`DecodeConfig`, read through its predicates: `uses_mbr`,
`uses_rerank`, `samples`, `aligns`), the engine that runs it, and what it asks for beyond
them (`Asked`: a target prefix, lexical constraints or terms, avoided phrases, inline markup,
word alignments, attention pictures, each under the name the user gave it). `check_decoding`
refuses what cannot be honoured together, and both sides call it:

- `mtrain.config_checks`, for translate, eval and serve before a model loads, with the
  command line's names (`terms=FILE.tsv: ...`; the CLI prints one line and exits 2);
- the request pipeline (`mtrain.decode.requests.pipeline`), for each HTTP request of either API,
  with the request's field names (`terms: ...`; the server answers 422).

`check_term_mode` is the rule between a glossary's terms and the model: written into the
source (decode.term_mode), they need a model that reads them there. The config checks ask it
of run='s config.yaml, the request pipeline of the model it has loaded.

A refusal (`RefusedCombination`) keeps the field and the reason apart: the reason is the same
words wherever the request came from.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from mtrain.config import AlignmentLevel, DecodeConfig, MbrCandidates, Sampling, TermMode, alignment_level
from mtrain.errors import MtrainError

# MBR draws and ranks its own candidates, and reranking reorders the n-best by features that
# know nothing of a forced prefix or required phrases: not combined with them (yet).
SELECTION_WITH_CONTROLS = (
    "MBR decoding and n-best reranking (decode.mbr, decode.rerank) do not take prefixes, constraints, "
    "terms or avoided phrases: decode those with beam search"
)
# MBR's candidates come from several decodes and are compared as texts: no attention is kept.
SELECTION_WITH_ALIGNMENT = (
    "MBR decoding (decode.mbr) keeps no attention for word alignments or markup: "
    "decode those with beam search (decode.mbr.candidates=none)"
)
SELECTION_WITH_PICTURES = (
    "MBR decoding (decode.mbr) keeps no attention to draw: draw attention pictures with beam search or "
    "sampling (decode.mbr.candidates=none)"
)
CONSTRAINTS_WITH_CTRANSLATE2 = (
    "CTranslate2 has no lexical constraints (it has prefixes and avoided phrases): "
    "use engine=torch with a run directory of `mtrain fit`"
)
MBR_CANDIDATES_KEY = "decode.mbr.num_candidates"  # a setting of the command or the server, never of a request
CONSTRAINTS_WITH_SAMPLING = "lexical constraints need beam search: decode them with decode.sampling=none"
MARKUP_WITH_SUBWORD_LINKS = (
    "markup puts its tags back by word alignments; decode.alignment=subword would print other links than "
    "it uses: use decode.alignment=word (or false)"
)
CTRANSLATE2_ALIGNMENT_LAYER = (
    "CTranslate2 gives the last layer's attention averaged over heads only; leave both unset "
    "(or layer -1), or use engine=torch"
)
# decode.term_mode=annotation|both writes a glossary's terms into the source, which only a model trained
# to read them there takes (model.term_factors).
TERMS_IN_A_PLAIN_SOURCE = (
    "this model reads no terms in its source (it was not trained with model.term_factors=true, "
    "train.term_alignment=...); use term_mode=constraints or auto"
)
CTRANSLATE2_EPSILON = (
    "CTranslate2 has no epsilon sampling (MBR's samples use it when decode.sampling=none); "
    "with engine=ctranslate2 use decode.sampling=topp or topk, or decode with engine=torch"
)


class RefusedCombination(MtrainError):
    """Features asked for together that cannot be honoured together: `field: reason`."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Asked:
    """What a decode asks for beyond its settings, each by the name the user gave it (the
    command line's `terms=FILE.tsv`, a request's `terms`); None: not asked."""

    prefix: str | None = None
    constraints: str | None = None  # lexical constraints: a line's or request's phrases, or a glossary's terms
    avoid: str | None = None
    markup: str | None = None  # format=xml|html: tags out, and back by word alignments
    alignment: str | None = None  # word (or subword) alignments in the output
    pictures: str | None = None  # cross-attention pictures (translate's attention=DIR)

    @property
    def controls(self) -> str | None:
        """The first target control asked for (prefix, constraints, avoided phrases), by its name."""
        return self.prefix or self.constraints or self.avoid

    def names(self) -> list[str]:
        return [value for value in (getattr(self, f.name) for f in fields(self)) if value is not None]


def check_decoding(decode: DecodeConfig, asked: Asked = Asked(), ctranslate2: bool = False) -> None:
    """RefusedCombination naming the first of `asked` (or the decode key) that cannot be
    honoured with `decode` on this engine (`ctranslate2`: CTranslate2, else mtrain's own)."""
    if decode.selects and asked.controls is not None:
        raise RefusedCombination(asked.controls, SELECTION_WITH_CONTROLS)
    if decode.uses_mbr:
        if asked.markup is not None or asked.alignment is not None:
            raise RefusedCombination(asked.markup or asked.alignment or "", SELECTION_WITH_ALIGNMENT)
        if asked.pictures is not None:
            raise RefusedCombination(asked.pictures, SELECTION_WITH_PICTURES)
    if asked.constraints is not None:
        check_constraint_search(asked.constraints, ctranslate2)
        if decode.samples:
            raise RefusedCombination(asked.constraints, CONSTRAINTS_WITH_SAMPLING)
    if asked.markup is not None and alignment_level(decode.alignment) is AlignmentLevel.subword:
        raise RefusedCombination(asked.markup, MARKUP_WITH_SUBWORD_LINKS)
    if ctranslate2:
        layer, head = decode.alignment_layer, decode.alignment_head
        aligned = decode.aligns or asked.alignment is not None or asked.markup is not None
        if aligned and (layer not in (None, -1) or head is not None):
            raise RefusedCombination(
                f"decode.alignment_layer={_null(layer)} alignment_head={_null(head)}", CTRANSLATE2_ALIGNMENT_LAYER
            )
        mbr_samples = MbrCandidates(decode.mbr.candidates) in (MbrCandidates.sample, MbrCandidates.both) or (
            decode.uses_mbr and decode.mbr.num_pseudo_refs is not None
        )
        if Sampling(decode.sampling) == Sampling.epsilon or (mbr_samples and not decode.samples):
            raise RefusedCombination("decode.sampling", CTRANSLATE2_EPSILON)


@dataclass(frozen=True)
class TermUse:
    """How glossary terms reach the translation (`decode.term_mode` on a model that does or
    does not read terms in its source: `model.term_factors`)."""

    constrain: bool  # each term a hard constraint of its sentence (placed by decode.term_placement)
    annotate: bool  # each term written after its source word (a term-aware model's input)

    @classmethod
    def of(cls, mode: TermMode | str, term_aware: bool) -> TermUse:
        mode = TermMode(mode)
        if mode is TermMode.auto:
            return cls(constrain=True, annotate=term_aware)
        return cls(constrain=mode in (TermMode.constraints, TermMode.both), annotate=mode is not TermMode.constraints)


def check_term_mode(decode: DecodeConfig, glossary: bool, term_aware: bool, name: str = "decode.term_mode") -> None:
    """RefusedCombination for a glossary's terms (`glossary`: there are some, or may be: a
    server's requests) asked as annotation of a model that cannot read them (`term_aware`: it
    was trained with model.term_factors). The config checks ask it of run='s config before the
    model loads; the request pipeline of the loaded model (an ensemble, an export)."""
    if glossary and TermUse.of(decode.term_mode, term_aware).annotate and not term_aware:
        raise RefusedCombination(f"{name}={TermMode(decode.term_mode).value}", TERMS_IN_A_PLAIN_SOURCE)


def check_constraint_search(field: str, ctranslate2: bool) -> None:
    """RefusedCombination naming `field` (how the constraints were asked for) where the engine has
    no constraint search: the one rule behind the config checks, each HTTP request
    (`check_decoding`) and the CTranslate2 engine itself, should a batch with constraints reach it."""
    if ctranslate2:
        raise RefusedCombination(field, CONSTRAINTS_WITH_CTRANSLATE2)


def check_nbest(decode: DecodeConfig, nbest_key: str = "decode.nbest", beam_key: str = "decode.beam") -> None:
    """RefusedCombination naming `nbest_key` for more hypotheses per sentence than the decode
    keeps: above MBR's candidates (which it ranks), or, with beam search, above the beam. The
    config checks call it with the command line's keys (`decode.nbest`, `decode.beam`), serve
    with a request's fields (`nbest`, `beam`): one verdict, the same words."""
    if decode.uses_mbr:
        if decode.nbest > decode.mbr.num_candidates:
            raise RefusedCombination(
                nbest_key,
                f"{decode.nbest} is above {MBR_CANDIDATES_KEY}={decode.mbr.num_candidates} (MBR ranks only its "
                f"candidates); raise {MBR_CANDIDATES_KEY}",
            )
    elif not decode.samples and decode.nbest > decode.beam:
        raise RefusedCombination(
            nbest_key,
            f"{decode.nbest} is above {beam_key}={decode.beam} (beam search keeps only `beam` hypotheses); "
            f"raise {beam_key}",
        )


def _null(value: object) -> str:
    return "null" if value is None else str(value)
