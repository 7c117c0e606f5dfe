"""The web page of `mtrain serve`, at GET /: type or paste text, pick the languages, translate,
read the translation and, when asked, its alternatives.

The page is one HTML file shipped with mtrain (`mtrain/serve/static/translate.html`, package data)
with its style and script inside: no external asset, so it works offline, and its
Content-Security-Policy forbids loading any (it may only call this server). It speaks the
server's LibreTranslate API (serve.libretranslate): GET languages fills the language lists
(the target list is a choice for a multilingual run), POST translate sends the text, the
target and the number of alternatives. With API keys on (serve.access), a 403 answer shows a
field for the key.
"""

from __future__ import annotations

from importlib.resources import files

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

# Inline style and script only; requests to this server only.
POLICY = (
    "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'"
)


def page_html() -> str:
    return files("mtrain.serve").joinpath("static").joinpath("translate.html").read_text(encoding="utf-8")


def page_router() -> APIRouter:
    router = APIRouter()
    html = page_html()  # read once, when the app is built

    @router.get("/", include_in_schema=False)
    async def page() -> HTMLResponse:
        return HTMLResponse(html, headers={"Content-Security-Policy": POLICY, "Cache-Control": "no-cache"})

    return router
