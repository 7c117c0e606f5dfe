"""`mtrain serve`: translate over HTTP (JSON), batching concurrent requests together.

    mtrain serve run=RUN_DIR                          # http://127.0.0.1:8080
    mtrain serve run=RUN_DIR host=0.0.0.0 port=9000 decode.beam=4
    mtrain serve run=EXPORTED_DIR                     # from `mtrain export`: CTranslate2 decodes it
    curl -s localhost:8080/translate -H 'Content-Type: application/json' -d '{"text": ["Ein Hund."]}'

The port is bound before the model loads (a port in use is one line at once). One uvicorn
process, one event loop for HTTP (`serve.app`), two decoding threads (`mtrain.serve.batcher`:
one for requests with constraints, one for the rest) that share the engine; `serve.protocol` bounds what a client may hold (read_timeout_s,
max_connections, max_request_bytes). SIGTERM or Ctrl-C: uvicorn stops accepting connections
and answers the requests in flight, the decoder drains, and the command exits with status 0.
Logs go to stderr, one line per request (access_log); nothing is written to disk.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

from mtrain.cli.common import mtrain_app
from mtrain.config import ServeConfig
from mtrain.errors import MtrainError

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI

log = logging.getLogger("mtrain.serve")


def run_serve(cfg: ServeConfig) -> None:
    """Open the run's engine and serve it until a stop signal."""
    import uvicorn

    from mtrain.decode.engines.threads import describe_threads, set_decode_threads
    from mtrain.decode.requests.controls import LineControls, describe_controls
    from mtrain.decode.selection.rerank import check_rerank_files
    from mtrain.decode.selection.selecting import describe_search
    from mtrain.decoding_rules import check_term_mode
    from mtrain.runtime import describe_device, resolve_device, set_tf32
    from mtrain.serve.app import build_app
    from mtrain.serve.guards import check_browser_rules
    from mtrain.serve.model import open_served_model
    from mtrain.serve.translation import server_glossary

    if cfg.run is None:
        raise MtrainError(
            "run=RUN_DIR is missing: give the directory `mtrain fit` wrote, or an `mtrain export` directory"
            + ("; an ensemble is written run=A ensemble=[B,...] (run= gives the tokenizer)" if cfg.ensemble else "")
        )
    check_rerank_files(cfg.decode, cfg.run)  # before the model loads
    check_browser_rules(cfg)
    glossary = server_glossary(cfg)  # (a malformed line: one line, before the model loads)
    allow_open_files(cfg.max_connections)
    listener = listen(cfg.host, cfg.port)
    try:
        threads = set_decode_threads(cfg.num_threads)
        device = resolve_device(cfg.device)
        set_tf32(device, cfg.tf32)
        model = open_served_model(cfg, device, threads)
        # Any request may bring terms: refused now, as translate refuses it, not at every request.
        check_term_mode(cfg.decode, glossary=True, term_aware=model.term_aware)
        server = uvicorn.Server(uvicorn_config(build_app(model, cfg, glossary), cfg))
        host, port = listener.getsockname()[:2]
        controls = describe_controls(LineControls(glossary=glossary), terms=cfg.terms)
        log.info(
            "serving %s (engine=%s on %s, %s, %s%s) on http://%s:%d",
            model.description,
            model.engine_name,
            describe_device(model.device, cfg.tf32),
            describe_search(cfg.decode),
            describe_threads(threads, chosen=cfg.num_threads is not None),
            f", {controls} for every request" if controls else "",
            f"[{host}]" if ":" in host else host,
            port,
        )
        with stop_signals_end_the_server():
            server.run(sockets=[listener])
    finally:
        listener.close()


def uvicorn_config(app: FastAPI, cfg: ServeConfig) -> uvicorn.Config:
    """How uvicorn runs `app`: mtrain's guarded HTTP/1.1 protocol, mtrain's log (one line per
    request from serve.protocol.RequestLog, none from uvicorn), the app's lifespan. uvicorn's
    X-Forwarded-For handling is off: it trusts 127.0.0.1 by default, and the client's address
    is the socket's unless `trusted_proxies` says otherwise (serve.guards)."""
    import uvicorn

    from mtrain.serve.protocol import guarded_protocol

    return uvicorn.Config(
        app,
        http=guarded_protocol(cfg.read_timeout_s, cfg.max_connections),
        log_config=None,
        access_log=False,
        proxy_headers=False,
        lifespan="on",
    )


# Files the server holds besides its connections: the listener, the model's files, Python's own.
FILES_BESIDES_CONNECTIONS = 64


def allow_open_files(max_connections: int) -> None:
    """Raise this process's limit on open files (`ulimit -n`) to fit `max_connections`, up to
    the hard limit; an MtrainError naming the key if even that is too low."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return
    needed = max_connections + FILES_BESIDES_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise MtrainError(
            f"max_connections: {max_connections} connections need {needed} open files, but this "
            f"process may open {hard} (ulimit -Hn); lower max_connections= or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to host:port (port 0: any free one), or an MtrainError naming the key."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise MtrainError(f"host={host}: not an address to listen on ({error.strerror})") from None
    listener = socket.socket(family, kind, proto)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(address)
    except OSError as error:
        listener.close()
        raise MtrainError(
            f"port={port}: cannot listen on {host}:{port} ({error.strerror or error}); choose another port= (or host=)"
        ) from None
    listener.listen(2048)
    return listener


@contextlib.contextmanager
def stop_signals_end_the_server() -> Iterator[None]:
    """uvicorn handles SIGTERM/SIGINT while it runs (a graceful shutdown), then raises the signal
    again to the handler it found: ours does nothing, so the command ends with status 0 rather
    than being killed by it. Outside the server the signals keep their usual handlers."""
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@mtrain_app("serve")
def main(cfg: ServeConfig) -> None:
    run_serve(cfg)


if __name__ == "__main__":
    main()
