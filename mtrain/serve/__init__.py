"""Serving: a run's engine over HTTP, for `mtrain serve` (mtrain/cli/serve.py, the command).

Files, in reading order: `batcher.py` (dynamic batching: concurrent requests into few
decoding batches, a worker thread per lane; nothing of HTTP or engines in it), `translation.py`
(the one path of both APIs to the batcher: the rules, the limits of a constrained search, the lanes), `model.py` (the
engine opened once and the batch function; the target-language check), `protocol.py`
(uvicorn's HTTP/1.1 protocol with deadlines and bounds; the request body, the request log),
`access.py` (API keys, wrong-key and rate limits), `guards.py` (the client's address behind
trusted proxies, the Host allow-list, CORS, the headers against framing), `libretranslate.py`
(LibreTranslate's API beside mtrain's), `page.py` and `static/translate.html` (the web page
at GET /), `app.py` (the FastAPI app: mtrain's routes, their checks and messages, and the
others included).

This package sits between the commands (`mtrain.cli`) and the exports (`mtrain.export`,
whose `open_engine` it uses); nothing below it imports it. FastAPI, Starlette and uvicorn
are imported only here and by the command.
"""
