"""Requests (above `mtrain.decode.translation`): what a sentence asks of its translation, from
the parsed input to the result.

- `text_files.py`: the small text files a request names (terms, avoided phrases);
- `terminology.py`: glossaries; `markup.py`: inline tags out and back;
- `controls.py`: what a request asks of its output, as text and as target ids;
- `pipeline.py`: `RequestPipeline`, the rules of `mtrain.decoding_rules`, markup, terms,
  controls, the decoder, tags back, what constraints and terms did.
"""
