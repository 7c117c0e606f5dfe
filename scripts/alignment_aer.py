"""Alignment error rate (AER) of a run's cross-attention against reference alignments, for
every decoder layer, the average of its heads and each head.

    python scripts/alignment_aer.py --run RUN --src test.de.gz --ref test.en.gz --gold test.de-en.align
    python scripts/alignment_aer.py --predicted out.align --gold out.de-en.align   # two Pharaoh files

The run reads each source and its reference translation teacher-forced (forced decoding, the
protocol of Garg et al. 2019 and Zenkel et al.: the reference's words are the alignment's
target words), and each reference piece is aligned to the source piece its attention row
weighs most (and/or each source piece to the reference piece attending to it most: every
`decode.alignment_rule`), mapped to words as `decode.alignment=word` does (mtrain.decode.translation.alignment).
"step t" is the row that predicts piece t (what decoding has when it emits the piece: what
`decode.alignment` writes); "step t+1" the row whose input is piece t (reported for
comparison). The gold alignments have no possible/sure distinction (eflomal's symmetrised
links, scripts/align_eflomal.py): AER = 1 - 2|A & G| / (|A| + |G|).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import torch

from mtrain.checkpoint.files import load_run
from mtrain.decode.translation.alignment import parse_pharaoh, piece_links, to_words
from mtrain.model.attention import padding_bias
from mtrain.model.precision import to_compute_dtype

BATCH = 64
# (decode.alignment_rule, rows shifted by one step): the rules decoding offers, and the target
# rule on the rows whose input (not output) is the piece, for comparison
RULES = (("source", 0), ("target", 0), ("union", 0), ("target", 1))


def read_lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


@torch.inference_mode()
def layer_attention(model, src: list[list[int]], tgt: list[list[int]], pad: int, bos: int) -> torch.Tensor:
    """Teacher-forced cross-attention (batch, layers, heads, tgt_len + 1, src_len)."""
    src_tokens = torch.full((len(src), max(map(len, src))), pad, dtype=torch.long)
    tgt_input = torch.full((len(tgt), max(map(len, tgt)) + 1), pad, dtype=torch.long)
    for row, (s, t) in enumerate(zip(src, tgt, strict=True)):
        src_tokens[row, : len(s)] = torch.tensor(s)
        tgt_input[row, 0] = bos
        tgt_input[row, 1 : len(t) + 1] = torch.tensor(t)
    mask = src_tokens.eq(pad)
    memory = to_compute_dtype(model.encode(src_tokens, mask))
    bias = padding_bias(mask)
    x = model.tgt_embed(tgt_input)
    layers = []
    for layer in model.decoder:
        keys, values = layer.cross_attn.project_memory(memory)
        x, weights = layer(x, keys, values, bias, need_weights=True)
        layers.append(weights.float())
    return torch.stack(layers, dim=1)


def aer(predicted: list[set[tuple[int, int]]], gold: list[set[tuple[int, int]]]) -> float:
    both = sum(len(p & g) for p, g in zip(predicted, gold, strict=True))
    total = sum(len(p) + len(g) for p, g in zip(predicted, gold, strict=True))
    return 1.0 - 2.0 * both / max(total, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", help="a run: its attention, teacher-forced on --src/--ref")
    parser.add_argument(
        "--predicted",
        type=Path,
        help="instead of --run: a Pharaoh file (e.g. `decode.alignment=true | cut -f2`) scored against --gold",
    )
    parser.add_argument("--checkpoint", default="best")
    parser.add_argument("--src", type=Path)
    parser.add_argument("--ref", type=Path)
    parser.add_argument("--gold", type=Path, required=True, help="Pharaoh alignments of src-ref (the reference)")
    parser.add_argument("--limit", type=int, default=None, help="first N lines only")
    parser.add_argument("--json", type=Path, default=None, help="also write the table as JSON")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.predicted is not None:
        gold_links = [set(parse_pharaoh(line, f"{args.gold}:{n}")) for n, line in enumerate(read_lines(args.gold), 1)]
        predicted_links = [
            set(parse_pharaoh(line, f"{args.predicted}:{n}")) for n, line in enumerate(read_lines(args.predicted), 1)
        ]
        print(f"AER {100 * aer(predicted_links, gold_links):.1f} over {len(gold_links)} lines")
        return
    if args.run is None or args.src is None or args.ref is None:
        parser.error("give --run with --src and --ref, or --predicted")

    loaded = load_run(args.run, which=args.checkpoint)
    model, tok = loaded.model.eval(), loaded.tokenizer
    sources, references = read_lines(args.src)[: args.limit], read_lines(args.ref)[: args.limit]
    gold = [set(parse_pharaoh(line, f"{args.gold}:{n}")) for n, line in enumerate(read_lines(args.gold), 1)]
    gold = gold[: len(sources)]
    src_ids = [tok.encode_src(s) for s in sources]
    tgt_ids = [tok.encode_tgt(t) for t in references]
    prefix = len(tok.source_prefix)
    layers = len(model.decoder)
    heads = model.decoder[0].cross_attn.heads
    # predicted[(shift, layer, head or "avg")] -> list of link sets
    predicted: dict[tuple[str, int, int, str], list[set[tuple[int, int]]]] = {}
    for start in range(0, len(sources), BATCH):
        src = [ids + [tok.eos_id] for ids in src_ids[start : start + BATCH]]
        tgt = tgt_ids[start : start + BATCH]
        attention = layer_attention(model, src, tgt, tok.pad_id, tok.bos_id)
        for row, (s, t) in enumerate(zip(src, tgt, strict=True)):
            src_pieces = tok.src_pieces(s[prefix:-1])
            tgt_pieces = tok.tgt_pieces(t)
            for layer in range(layers):
                per_head = attention[row, layer]  # (heads, tgt_len + 1, src_len)
                choices = {"avg": per_head.mean(dim=0), **{str(h): per_head[h] for h in range(heads)}}
                for name, weights in choices.items():
                    for rule, shift in RULES:
                        links = piece_links(weights[shift:], len(src_pieces), len(tgt_pieces), prefix, rule)
                        key = (rule, shift, layer, name)
                        predicted.setdefault(key, []).append(set(to_words(links, src_pieces, tgt_pieces)))
    table = {
        f"{rule} step t{'+1' if shift else ''} layer {layer} head {name}": aer(links, gold)
        for (rule, shift, layer, name), links in predicted.items()
    }
    for rule, shift in RULES:
        print(f"alignment_rule={rule}, rows of step t{'+1' if shift else ''}:")
        for layer in range(layers):
            avg = aer(predicted[(rule, shift, layer, "avg")], gold)
            per_head = {h: aer(predicted[(rule, shift, layer, str(h))], gold) for h in range(heads)}
            best = min(per_head, key=per_head.__getitem__)
            print(
                f"  layer {layer}: heads averaged AER {100 * avg:.1f}; best head {best} {100 * per_head[best]:.1f}; "
                f"heads {' '.join(f'{100 * v:.1f}' for v in per_head.values())}"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(table, indent=1), encoding="utf-8")
    print(f"{len(sources)} sentences, {args.run}", file=sys.stderr)


if __name__ == "__main__":
    main()
