"""webhook-ledger: applies each provider webhook to the ledger exactly once."""

from flask import Flask

from . import cli, db, delivery, errors, lock, logs, metrics, openapi, webhooks
from . import config as settings


def create_app(test_config=None):
    """Build the app from the environment, or from test_config when given."""
    app = Flask(__name__)
    parsed = settings.parse(test_config) if test_config is not None else settings.from_env()
    app.config.update(parsed)
    # Flask answers 413 past this; webhooks.py refuses the one byte more,
    # which it reads to tell a chunked body cut at the limit.
    app.config["MAX_CONTENT_LENGTH"] = parsed["MAX_BODY_BYTES"] + 1
    logs.init_app(app)
    for warning in settings.check_nesting(parsed):
        app.logger.warning("timeouts do not nest: %s", warning)

    errors.init_app(app)
    delivery.init_app(app)
    db.init_app(app)
    lock.init_app(app)
    metrics.init_app(app)
    openapi.init_app(app)
    cli.init_app(app)
    app.register_blueprint(webhooks.bp)
    return app
