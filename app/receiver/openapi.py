"""The OpenAPI 3.1 document of the HTTP surface, kept beside this module
(openapi.json) and served as it is at GET /openapi.json."""

import json
from pathlib import Path

from flask import Flask, current_app

DOCUMENT_PATH = Path(__file__).resolve().parent / "openapi.json"


def init_app(app: Flask) -> None:
    # Read once at start-up: a broken document stops the app, not a request.
    app.extensions["openapi"] = json.loads(DOCUMENT_PATH.read_text())
    app.add_url_rule("/openapi.json", "openapi", document)


def document() -> dict[str, object]:
    """The OpenAPI document."""
    return current_app.extensions["openapi"]
