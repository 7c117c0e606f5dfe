"""A run's weights on disk, for every stage that reads or writes them.

files.py       the checkpoint format: written atomically, loaded safely (weights_only, CRC-checked),
               the stored config and which weights (raw or EMA) decode; `load_run` rebuilds a run's
               model and tokenizer for decoding
hf_weights.py  transformers' encoder-decoder weight names in mtrain's model, both ways (import and export)

Training (mtrain.train) writes checkpoints through here and adds what only it needs (the
trainer's state, resuming); decoding, export, evaluation and the server read them through here
and never import mtrain.train.
"""
