"""Requests (above `mtrain.decode.translation`): what a sentence asks of its translation, from
the parsed input to the result.

- `request.py`: `DecodeRequest`, one sentence's request from the parsed input to its result;
- `text_files.py`: the small text files a request names (terms, avoided phrases);
- `terminology.py`: glossaries; `markup.py`: inline tags out and back;
- `controls.py`: what a request asks of its output, as text and as target ids;
- `pipeline.py`: `begin_translation` (the rules of `mtrain.decoding_rules`, markup, terms) and
  `Translation.finish` (tags back, what constraints and terms did), the one sequence of every
  command and API; `RequestPipeline`: an engine's decoder step between them.
"""
