"""Write mtrain/export/keep_lines_whole.onnx: the sentence splitter of mtrain's Argos packages.

    pip install onnx && python scripts/make_argos_splitter.py

Argos Translate (1.11) splits every line of a text into sentences with MiniSBD before
translating, and MiniSBD downloads its model for the source language on first use, unless the
package carries one as `minisbd/*.onnx`. mtrain translates one line as one sentence (`mtrain
translate`, `mtrain serve`), so its packages carry this model: a MiniSBD model in form (its
inputs `units` and `features`, its metadata `config`, `vocab`, `lexicon`) that scores every
character "inside a token" (class 0 of 5) for any input. MiniSBD always ends a paragraph at
its last character, and `no_ssplit` keeps it from splitting anywhere else, so each line comes
back whole (stripped of surrounding spaces, which SentencePiece drops anyway) and nothing is
downloaded. The file is a few hundred bytes and committed; this script is how it was made.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
from onnx import TensorProto, helper

OUT = Path(__file__).resolve().parents[1] / "mtrain" / "export" / "keep_lines_whole.onnx"
CLASSES = 5  # MiniSBD's (stanza's) labels: inside, token end, sentence end, and two multi-word ones

# What minisbd.inference.create_session reads from the model's metadata.
CONFIG = {
    "no_ssplit": True,
    "skip_newline": False,
    "max_seqlen": 1000,
    "batch_size": 32,
    "feat_funcs": [],
    "use_dictionary": False,
    "num_dict_feat": 0,
}
VOCAB = {
    "lang": "",
    "idx": 0,
    "cutoff": 0,
    "lower": False,
    "_unit2id": {"<PAD>": 0, "<UNK>": 1},
    "_id2unit": ["<PAD>", "<UNK>"],
}


def build() -> onnx.ModelProto:
    units = helper.make_tensor_value_info("units", TensorProto.INT64, ["batch", "length"])
    features = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", "length", "features"])
    scores = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["batch", "length", CLASSES])
    zeros = helper.make_tensor("zeros", TensorProto.FLOAT, [1, 1, CLASSES], [0.0] * CLASSES)
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    nodes = [  # scores = float(units)[..., None] * zeros: (batch, length, CLASSES), all 0
        helper.make_node("Cast", ["units"], ["units_float"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["units_float", "axes"], ["column"]),
        helper.make_node("Mul", ["column", "zeros"], ["scores"]),
    ]
    graph = helper.make_graph(nodes, "keep_lines_whole", [units, features], [scores], initializer=[zeros, axes])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="mtrain")
    model.ir_version = 8  # readable by every onnxruntime minisbd accepts (>= 1.10)
    helper.set_model_props(
        model, {"lang_code": "xx", "config": json.dumps(CONFIG), "vocab": json.dumps(VOCAB), "lexicon": "null"}
    )
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    onnx.save(build(), str(OUT))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")
