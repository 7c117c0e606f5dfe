"""Export: trained runs to inference engines (CTranslate2) and to transformers.

Files: `ctranslate2_spec.py` (mtrain's model switches mapped onto a CTranslate2
`TransformerSpec`, or refused), `ctranslate2_model.py` (the model directory: spec,
vocabulary, SentencePiece model, metadata), `engine.py` (`open_engine`: a run's decoding engine for
`mtrain translate` and `mtrain eval`, torch or CTranslate2: its export directory, or its
checkpoint converted on the fly). Decoding with the exported
model is `mtrain.decode.engines.ct2_engine`, which reads the directory without importing this package. `ctranslate2` is an optional dependency (`pip install mtrain[ct2]`),
imported only when an export or a CTranslate2 decode runs.

`format=hf`: `hf_model.py` (mtrain's switches mapped onto transformers' Pegasus, or refused),
`hf_tokenizer.py` (the SentencePiece model for the `tokenizers` library), `hf_generation.py`
(the decoding settings as a GenerationConfig), `model_card.py` (README.md), `hf_export.py`
(the directory). `transformers` is optional too (`pip install mtrain[hf]`).

`format=argos`: `argos.py` (the package), `argos_score.py` (the BLEU of Argos's decoding settings).
Every format: `target.py` (the mark an export leaves, and the one rule of what `force=true` may
replace), `portable.py` (no path of the exporting machine in what is written), and
`mtrain.rundir.staged` (built beside `out`, renamed into place).
"""

from mtrain.decode.engines.ct2_engine import METADATA_FILE
from mtrain.export.ctranslate2_model import export_ctranslate2, export_run
from mtrain.export.ctranslate2_spec import check_exportable
from mtrain.export.hf_export import export_hf_run

__all__ = ["METADATA_FILE", "check_exportable", "export_ctranslate2", "export_hf_run", "export_run"]
