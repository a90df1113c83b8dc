"""webhook-ledger: applies each provider webhook to the ledger exactly once."""

import logging
import sys

from flask import Flask

from . import config as settings
from . import db, errors, lock, webhooks


def create_app(test_config=None):
    """Build the app from the environment, or from test_config when given."""
    app = Flask(__name__)
    parsed = settings.parse(test_config) if test_config is not None else settings.from_env()
    app.config.update(parsed)
    app.config["MAX_CONTENT_LENGTH"] = parsed["MAX_BODY_BYTES"]  # Flask answers 413
    _configure_logging()
    for warning in settings.check_nesting(parsed):
        app.logger.warning("timeouts do not nest: %s", warning)

    errors.init_app(app)
    db.init_app(app)
    lock.init_app(app)
    app.register_blueprint(webhooks.bp)
    return app


def _configure_logging():
    # gunicorn and `flask run` leave the root logger bare; one line per event.
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.INFO)
