"""`prepare_data`: from a data config to a tokenizer and encoded, memory-mapped splits.

Steps: resolve where each training corpus is (`data`, or every entry of `data.corpora`:
mtrain.data.corpora) and where each direction's validation/test sets are (data's own source),
train or reuse the joint tokenizer (tags as reserved symbols), then encode each training
corpus into its own cache entry (mtrain.batches.training_set: cleaned, tagged, first
`train_limit` pairs) and each direction's valid and test sets into theirs
(mtrain.batches.eval_sets). Every entry is keyed by what determines its arrays and nothing
else, so a second run with the same settings loads everything without encoding, and a run
that changes a test split or adds a corpus encodes only what is new. An interrupted build
never becomes an entry (see mtrain.data.cache) and is rebuilt by the next run.

Preparation also counts train–test overlap per corpus (mtrain.data.overlap) and reads the
provenance of corpora that `mtrain translate` wrote; `PreparedData.summary` holds both and the
cleaning counts, for the run's metrics.json.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtrain.batches.corpus import EncodedCorpus
from mtrain.batches.eval_sets import EvalSet, eval_set
from mtrain.batches.mixture import ConcatenatedCorpus, CorpusPart
from mtrain.batches.sampling import SAMPLING_FORMAT, build_copies, check_sampling_config, open_copies, sampling_enabled
from mtrain.batches.training_set import EncodedTrainingSet, training_set
from mtrain.config import DataConfig, TokenizerConfig, check_corpora
from mtrain.data.cache import build_entry, fingerprint, is_complete
from mtrain.data.cleaning import check_clean_config
from mtrain.data.corpora import TrainingCorpus, evaluation_sources, training_corpora
from mtrain.data.overlap import EvalHashes, count_overlap
from mtrain.data.sources import ParallelText, resolve_source
from mtrain.data.tags import Direction, run_directions, source_tags
from mtrain.errors import MtrainError
from mtrain.tokenizer import Tokenizer, train_or_load_tokenizer

if TYPE_CHECKING:
    from mtrain.batches.guided_alignment import GuidedAlignments

Log = Callable[[str], Any]


@dataclass
class DirectionData:
    """The evaluation sets of one direction a run trains: validation and test, encoded (with
    the direction's tags at the start of each source) and as raw text for BLEU."""

    src: str
    tgt: str
    tag_ids: list[int]  # prepended to every source sentence of this direction; [] without tags
    valid: EncodedCorpus
    valid_text: ParallelText
    test: EncodedCorpus | None
    test_text: ParallelText

    @property
    def name(self) -> str:
        return f"{self.src}-{self.tgt}"


@dataclass
class PreparedData:
    tokenizer: Tokenizer
    train: EncodedCorpus | ConcatenatedCorpus  # the concatenation of data.corpora's entries
    valid: EncodedCorpus
    test: EncodedCorpus | None  # None without a test split (data.splits.test=null)
    valid_text: ParallelText  # raw source/reference sentences for BLEU
    test_text: ParallelText
    directory: Path  # the cache entry of the (first) training corpus
    fingerprint: str = ""  # of everything encoded: every entry's key (tokenizer, sources, settings)
    # data.subword_sampling: sampled segmentations of `train`, epoch e trains on
    # train_copies[(e - 1) % len]; empty without sampling (every epoch trains on `train`)
    train_copies: list[EncodedCorpus] = field(default_factory=list)
    # data.corpora: every training corpus on its own (`train` is then their ConcatenatedCorpus);
    # one part (the whole of `train`) for a single corpus.
    train_parts: list[CorpusPart] = field(default_factory=list)
    # one per direction trained (valid/test/valid_text/test_text above are directions[0]'s)
    directions: list[DirectionData] = field(default_factory=list)
    # for metrics.json: per corpus its cleaning counts, train–test overlap and provenance;
    # per direction its valid/test counts
    summary: dict[str, Any] = field(default_factory=dict)
    # train.guided_alignment's subword links of `train` (set by mtrain.train.setup), else None
    guided_alignment: GuidedAlignments | None = None

    def training_corpora(self) -> list[EncodedCorpus | ConcatenatedCorpus]:
        """Every segmentation training may see: `train`, and its sampled copies."""
        return [self.train, *self.train_copies]


def prepare_data(
    data_cfg: DataConfig, tok_cfg: TokenizerConfig, log: Log = print, tokenizer: Tokenizer | None = None
) -> PreparedData:
    """Tokenizer and encoded splits for `data_cfg` and `tok_cfg`; either may also be the
    OmegaConf node of its section (only attributes are read). `tokenizer`: use this one (a
    parent run's, when fine-tuning) instead of training or loading one."""
    check_clean_config(data_cfg.clean)
    check_sampling_config(data_cfg.subword_sampling, tok_cfg.model_type)
    check_corpora(data_cfg, tok_cfg)
    corpora = training_corpora(data_cfg, None if data_cfg.corpora else resolve_source(data_cfg))
    eval_sources = evaluation_sources(data_cfg, corpora)
    for corpus in corpora:
        name = corpus.label if corpus.key == "data" else f"{corpus.key} {corpus.label}"
        log(
            f"data: {name} {corpus.cfg.src}->{corpus.cfg.tgt} from {corpus.source.description}"
            + (f", weight {corpus.weight:g}" if data_cfg.corpora else "")
            + (f", tag <{corpus.tag}>" if corpus.tag else "")
        )
    if tokenizer is None:
        tokenizer = train_or_load_tokenizer(
            tok_cfg, data_cfg, source=corpora[0].source, log=log, corpora=corpora if data_cfg.corpora else ()
        )
    else:
        log(f"tokenizer: the given one ({', '.join(str(path) for path in tokenizer.files.values())})")
    if tokenizer.marian and sampling_enabled(data_cfg.subword_sampling):
        raise MtrainError(
            "data.subword_sampling: the imported model's tokenizer numbers its pieces by vocab.json, "
            "which SentencePiece's sampler does not know; drop data.subword_sampling"
        )
    model_files = _model_files(tokenizer)
    drop = bool(data_cfg.clean.drop_eval_overlap)
    if drop:  # the evaluation sets decide which training pairs are dropped: encode them first
        evals = _evaluation_sets(data_cfg, eval_sources, tokenizer, model_files, log)
    sets: list[EncodedTrainingSet] = []
    for corpus in corpora:
        src_prefix, tgt_prefix = language_prefixes(tokenizer, corpus.cfg.src, corpus.cfg.tgt)
        tag_ids = src_prefix + tag_ids_of(
            tokenizer, source_tags(data_cfg, corpus.cfg.tgt, corpus.tag), data_cfg, corpus
        )
        dropped = _union(evals[corpus.direction]) if drop else None
        sets.append(training_set(corpus, data_cfg, tokenizer, model_files, tag_ids, dropped, log, tgt_prefix))
    if not drop:
        evals = _evaluation_sets(data_cfg, eval_sources, tokenizer, model_files, log)

    directions = []
    for direction in run_directions(data_cfg):
        valid, test = evals[direction]
        assert valid.corpus is not None  # only the test split can be switched off (data.splits.test=null)
        tag_ids = language_prefixes(tokenizer, *direction)[0] + tag_ids_of(
            tokenizer, source_tags(data_cfg, direction[1]), data_cfg
        )
        directions.append(
            DirectionData(direction[0], direction[1], tag_ids, valid.corpus, valid.text, test.corpus, test.text)
        )
    keys = [encoded.key for encoded in sets] + [split.key for pair in evals.values() for split in pair]
    data = PreparedData(
        tokenizer=tokenizer,
        valid=directions[0].valid,
        test=directions[0].test,
        train=sets[0].corpus if len(sets) == 1 else ConcatenatedCorpus([encoded.corpus for encoded in sets]),
        valid_text=directions[0].valid_text,
        test_text=directions[0].test_text,
        directory=sets[0].entry,
        fingerprint=fingerprint("prepared", keys),
        train_parts=[
            CorpusPart(corpus.label, corpus.cfg.src, corpus.cfg.tgt, encoded.corpus, corpus.weight, corpus.tag)
            for corpus, encoded in zip(corpora, sets, strict=True)
        ],
        directions=directions,
    )
    data.summary = _summary(corpora, sets, evals, log)
    if sampling_enabled(data_cfg.subword_sampling):
        _add_sampled_copies(data, data_cfg, sets[0], log)
    return data


def tag_ids_of(
    tokenizer: Tokenizer, symbols: list[str], data_cfg: DataConfig, corpus: TrainingCorpus | None = None
) -> list[int]:
    """The ids of tag symbols; a symbol the tokenizer lacks (one given from elsewhere, e.g. a
    parent run's) is refused, naming its key."""
    ids = [tokenizer.piece_id(symbol) for symbol in symbols]
    for symbol, piece in zip(symbols, ids, strict=True):
        if piece == tokenizer.unk_id:
            key = (
                f"{corpus.key}.tag"
                if corpus is not None and corpus.tag and symbol == f"<{corpus.tag}>"
                else "data.lang_tags"
            )
            raise MtrainError(
                f"{key}: the tokenizer has no piece {symbol} (it was trained without this tag); "
                "train a new tokenizer with the tags, or drop the tag"
            )
    return ids


def _evaluation_sets(
    data_cfg: DataConfig, sources: dict[Direction, Any], tokenizer: Tokenizer, model_files: tuple[str, str], log: Log
) -> dict[Direction, tuple[EvalSet, ...]]:
    """(valid, test) EvalSets of every direction trained."""
    evals = {}
    for direction, source in sources.items():
        src_prefix, tgt_prefix = language_prefixes(tokenizer, *direction)
        tag_ids = src_prefix + tag_ids_of(tokenizer, source_tags(data_cfg, direction[1]), data_cfg)
        evals[direction] = tuple(
            eval_set(split, direction, source, data_cfg, tokenizer, model_files, tag_ids, log, tgt_prefix)
            for split in ("valid", "test")
        )
    return evals


def language_prefixes(tokenizer: Tokenizer, src: str, tgt: str) -> tuple[list[int], list[int]]:
    """(source prefix, target prefix) of a direction: an M2M100/NLLB tokenizer's language tokens
    (`[src_lang] x </s>` in, `[tgt_lang] y </s>` as labels after the `</s>` start, as transformers
    and fairseq train these models), nothing for any other tokenizer (its tags come from
    data.lang_tags). An unknown language is refused in one line naming the nearest codes."""
    if not tokenizer.fairseq:
        return [], []
    directed = tokenizer.with_languages(src, tgt)
    return list(directed.source_prefix), list(directed.target_prefix)


def _union(pair: tuple[EvalSet, ...]) -> EvalHashes:
    return pair[0].hashes.union(pair[1].hashes)


def _summary(
    corpora: list[TrainingCorpus], sets: list[EncodedTrainingSet], evals: dict[Direction, tuple[EvalSet, ...]], log: Log
) -> dict[str, Any]:
    """Per corpus: counts, overlap and provenance; per direction: the eval sets' counts. Logged."""
    several = len(corpora) > 1 or corpora[0].key != "data"
    summary: dict[str, Any] = {"corpora": [], "directions": []}
    for corpus, encoded in zip(corpora, sets, strict=True):
        valid, test = evals[corpus.direction]
        overlap = count_overlap(
            encoded.src_hashes,
            encoded.pair_hashes,
            {"valid": valid.hashes, **({"test": test.hashes} if test.corpus is not None else {})},
        )
        record = {
            "name": corpus.label,
            "key": corpus.key,
            "src": corpus.cfg.src,
            "tgt": corpus.cfg.tgt,
            "weight": corpus.weight,
            "tag": corpus.tag,
            "train": encoded.summary,
            "eval_overlap": overlap,
            "cache_hit": encoded.cache_hit,
            "entry": str(encoded.entry),
        }
        provenance = corpus.provenance()
        if provenance:
            record["provenance"] = provenance
        summary["corpora"].append(record)
        _log_training(record, "train" if not several else f"train [{corpus.label}]", log)
    for (src, tgt), (valid, test) in evals.items():
        summary["directions"].append({"name": f"{src}-{tgt}", "valid": valid.counts, "test": test.counts})
        for split, counts in (("valid", valid.counts), ("test", test.counts))[: 2 if test.corpus is not None else 1]:
            where = split if len(evals) == 1 else f"{split} [{src}-{tgt}]"
            log(
                f"data: {where}: {counts['kept']:,} pairs; tokens: src {counts['src_tokens']:,}, "
                f"tgt {counts['tgt_tokens']:,}"
            )
    return summary


def _log_training(record: dict[str, Any], where: str, log: Log) -> None:
    train = record["train"]
    filtered = sum(train["filtered"].values())
    reasons = ", ".join(f"{reason} {count:,}" for reason, count in train["filtered"].items())
    log(
        f"data: {where}: {train['read']:,} pairs read, {filtered:,} filtered"
        f"{f' ({reasons})' if reasons else ''}, {train['kept']:,} kept; "
        f"tokens: src {train['src_tokens']:,}, tgt {train['tgt_tokens']:,}"
    )
    overlap = record["eval_overlap"]
    splits = " and ".join(split for split in overlap if split != "any")
    per_split = ", ".join(
        f"{split} {counts['source']:,}/{counts['pair']:,}" for split, counts in overlap.items() if split != "any"
    )
    log(
        f"data: {where}: {overlap['any']['source']:,} of {train['kept']:,} kept pairs have their source in "
        f"{splits} of {record['src']}-{record['tgt']}, {overlap['any']['pair']:,} the whole pair (sources/pairs: "
        f"{per_split}){'' if 'eval_overlap' in train['filtered'] else '; data.clean.drop_eval_overlap=true drops them'}"
    )
    for provenance in record.get("provenance", []):
        checkpoints = ", ".join(item["path"] for item in provenance.get("checkpoints", [])) or provenance.get("run")
        log(
            f"data: {where}: {provenance['file']} was written by `mtrain translate` with {checkpoints}"
            f"{'' if provenance.get('matches', True) else ' (but the file changed since)'}"
        )


def _add_sampled_copies(data: PreparedData, cfg: DataConfig, encoded: EncodedTrainingSet, log: Log) -> None:
    """Build (or reuse) the cached sampled segmentations of the training split (`mtrain.batches.sampling`)."""
    sampling = cfg.subword_sampling
    assert isinstance(data.train, EncodedCorpus)  # config_checks refuses sampling with several data.corpora
    key = fingerprint(
        "sampled", SAMPLING_FORMAT, encoded.key, float(sampling.alpha), sampling.nbest_size, sampling.copies
    )
    entry = data.directory.parent / f"{data.directory.name}-sampled-{key[:16]}"
    settings = f"alpha {sampling.alpha}, nbest_size {sampling.nbest_size}"
    if is_complete(entry):
        log(
            f"data: cache hit, reusing {sampling.copies} sampled segmentations of the training split "
            f"({settings}) in {entry}"
        )
    else:
        start = time.perf_counter()
        with build_entry(entry, log) as staging:
            build_copies(
                staging,
                data.train,
                _model_files(data.tokenizer),
                data.tokenizer.eos_id,
                sampling,
                cfg.num_workers,
            )
        log(
            f"data: {sampling.copies} sampled segmentations of the training split ({settings}) in "
            f"{time.perf_counter() - start:.1f} s -> {entry}"
        )
    data.train_copies = open_copies(entry, sampling.copies)
    data.fingerprint = fingerprint(
        "prepared with sampled copies", data.fingerprint, key
    )  # a resume finds the same copies
    tokens = [
        sum(int(corpus.tgt_lengths.sum()) for corpus in data.train_copies) / len(data.train_copies),
        int(data.train.tgt_lengths.sum()),
    ]
    log(
        f"data: subword sampling: {tokens[0] / tokens[1]:.3f}x the training targets' tokens "
        "(one copy per epoch, cycled)"
    )


def _model_files(tokenizer: Tokenizer) -> tuple[str, str]:
    """(source model, target model) paths: what a worker process needs to encode."""
    return tokenizer.model_files
