"""gunicorn's entry point: `gunicorn -c gunicorn.conf.py wsgi:app`."""

import sys

from app import create_app
from app.config import ConfigError

try:
    app = create_app()
except ConfigError as exc:
    # A one-line reason, not a traceback, is what an operator needs here.
    sys.exit(f"webhook-ledger: configuration error: {exc}")
