"""A run's SentencePiece model as a tokenizer that transformers' `AutoTokenizer` loads offline.

The `tokenizers` pipeline restates the SentencePiece model's own settings, read from its file,
so that encoding gives the ids `Tokenizer.encode_src` gives and decoding the text of
`Tokenizer.decode_tgt`:

    normalizer      the model's precompiled character map (nmt_nfkc), then SentencePiece's
                    removal of leading, trailing and repeated spaces
    pre-tokenizer   spaces become ▁, and a ▁ goes before the text (add_dummy_prefix)
    model           Unigram with the pieces' scores; or BPE, whose merges are ranked by the
                    merged piece's score (SentencePiece merges the best-scoring pair first)
    post-processor  eos after the text, as mtrain's encoded sources end
    decoder         the unknown piece as SentencePiece writes it (" ⁇ "), ▁ back to spaces,
                    the leading one dropped

The run's tags (`<2fr>`, `<bt>`: mtrain.data.tags) and the control pieces (pad, bos, eos) are
special tokens: split off before normalisation, so `"<2fr> Ein Mann"` encodes as `<2fr>` and
the pieces of "Ein Mann", which is how mtrain puts a tag before a sentence; and skipped when
decoding with `skip_special_tokens=True`. The unknown piece is not declared as transformers'
`unk_token`: transformers would make it special, and skipping it would drop the " ⁇ " that
mtrain's translations show where it occurs (encoding is the model's, with or without).
Measured by scripts/check_hf_tokenizer.py on all 64,028 Multi30k sentences (de and en: train,
val, test 2016 and 2017): SentencePiece's ids and decoded text for every one, with a unigram
and a BPE model of 8k pieces (docs/EXPORT.md).

A model with settings mtrain never trains (byte fallback, no dummy prefix, whitespace kept)
is refused, naming the setting.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sentencepiece import sentencepiece_model_pb2

from mtrain.errors import MtrainError
from mtrain.tokenizer import Tokenizer
from mtrain.tokenizer.tokenizer import JOINT_MODEL

if TYPE_CHECKING:  # optional dependencies, imported when an export runs
    import tokenizers
    from transformers import PreTrainedTokenizerFast

UNIGRAM, BPE = 1, 2  # sentencepiece_model.proto's TrainerSpec.ModelType
NORMAL = 1  # ModelProto.SentencePiece.Type: a piece learned from the text


def spm_to_tokenizers(model_file: Path, eos_piece: str) -> tokenizers.Tokenizer:
    """A `tokenizers.Tokenizer` that encodes and decodes as the SentencePiece model in `model_file`."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers, processors
    from tokenizers import Tokenizer as FastTokenizer
    from tokenizers.models import BPE as BPEModel
    from tokenizers.models import Unigram

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(Path(model_file).read_bytes())
    _check_convertible(proto, model_file)
    pieces = proto.pieces
    unk_id = proto.trainer_spec.unk_id
    if proto.trainer_spec.model_type == UNIGRAM:
        model: Any = Unigram([(piece.piece, piece.score) for piece in pieces], unk_id=unk_id, byte_fallback=False)
    else:
        model = BPEModel(
            {piece.piece: index for index, piece in enumerate(pieces)},
            _bpe_merges(pieces),
            unk_token=pieces[unk_id].piece,
            fuse_unk=True,  # SentencePiece makes one unknown piece of a run of unknown characters
            byte_fallback=False,
        )
    tokenizer = FastTokenizer(model)
    normalizer_steps: list[Any] = [
        normalizers.Replace(Regex(r"\A +| +\z"), ""),
        normalizers.Replace(Regex(" {2,}"), " "),
    ]
    charsmap = proto.normalizer_spec.precompiled_charsmap
    if charsmap:  # empty for the `identity` normalisation rule
        normalizer_steps.insert(0, normalizers.Precompiled(charsmap))
    tokenizer.normalizer = normalizers.Sequence(normalizer_steps)
    # "always": every stretch of text between special tokens gets its ▁, as SentencePiece gives
    # the text after a tag (encode_src encodes the sentence alone).
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=False)
    tokenizer.decoder = decoders.Sequence(
        [
            decoders.Replace(pieces[unk_id].piece, proto.trainer_spec.unk_surface),
            decoders.Metaspace(replacement="▁", prepend_scheme="always", split=False),
        ]
    )
    eos_id = tokenizer.token_to_id(eos_piece)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A {eos_piece}", pair=f"$A {eos_piece} $B {eos_piece}", special_tokens=[(eos_piece, eos_id)]
    )
    return tokenizer


def build_hf_tokenizer(tokenizer: Tokenizer, tags: Sequence[str], max_positions: int) -> PreTrainedTokenizerFast:
    """transformers' fast tokenizer of a run with a joint vocabulary: `tags` (the run's reserved
    symbols) are special tokens; `max_positions` bounds the inputs (`model_max_length`)."""
    from transformers import PreTrainedTokenizerFast

    if not tokenizer.joint:
        raise MtrainError("tokenizer.joint=false: format=hf writes one tokenizer for source and target")
    ids = tokenizer.special_ids
    pad, bos, eos = tokenizer.tgt_pieces([ids.pad, ids.bos, ids.eos])
    fast = spm_to_tokenizers(tokenizer.files[JOINT_MODEL], eos)
    for tag in tags:
        tokenizer.symbol_id(tag)  # one piece of the vocabulary, or MtrainError
    return PreTrainedTokenizerFast(
        tokenizer_object=fast,
        pad_token=pad,
        bos_token=bos,
        eos_token=eos,
        additional_special_tokens=list(tags),
        model_max_length=max_positions,
        padding_side="right",  # mtrain's batches are padded on the right
        clean_up_tokenization_spaces=False,  # decode as SentencePiece does
    )


def _bpe_merges(pieces: Any) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, the best-scoring merged piece first."""
    normal = {piece.piece: (piece.score, index) for index, piece in enumerate(pieces) if piece.type == NORMAL}
    ranked = sorted(
        (-score, index, text[:cut], text[cut:])
        for text, (score, index) in normal.items()
        for cut in range(1, len(text))
        if text[:cut] in normal and text[cut:] in normal
    )
    return [(left, right) for _, _, left, right in ranked]


def _check_convertible(proto: Any, model_file: Path) -> None:
    spec, normalizer = proto.trainer_spec, proto.normalizer_spec
    settings = {
        "trainer_spec.model_type": (spec.model_type in (UNIGRAM, BPE), "unigram or bpe"),
        "trainer_spec.byte_fallback": (not spec.byte_fallback, "false"),
        "normalizer_spec.add_dummy_prefix": (normalizer.add_dummy_prefix, "true"),
        "normalizer_spec.remove_extra_whitespaces": (normalizer.remove_extra_whitespaces, "true"),
        "normalizer_spec.escape_whitespaces": (normalizer.escape_whitespaces, "true"),
    }
    for name, (as_mtrain_trains, expected) in settings.items():
        if not as_mtrain_trains:
            raise MtrainError(
                f"tokenizer: {model_file} has {name} other than {expected}; format=hf converts "
                "SentencePiece models with the settings mtrain trains them with"
            )
