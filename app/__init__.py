"""webhook-ledger: applies each provider webhook to the ledger exactly once."""

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .settings import config
from .version import __version__

__all__ = ["__version__", "create_app"]

if TYPE_CHECKING:
    from flask import Flask


def create_app(test_config: Mapping[str, object] | None = None, needs: config.Needs | None = None) -> "Flask":
    """Build the app from the environment, or from test_config (setting name -> value) when given.

    needs: the least it must read of the settings (wsgi.py: Needs.SERVICE), else ConfigError.
    """
    # Imported here, as flaskr imports its modules: `import app.settings.config` alone
    # stays light (no Flask), for gunicorn's master's check (gunicorn.conf.py).
    from flask import Flask

    from .commands import audit_cli, cli, payments, users
    from .commands.base import config_error_in_one_line
    from .locking import lock
    from .receiver import delivery, errors, fetch, logs, metrics, openapi, release, webhooks
    from .store import db

    app = Flask(__name__)
    environ = os.environ if test_config is None else {name: str(value) for name, value in test_config.items()}
    with config_error_in_one_line():  # `flask` builds the app before any command of ours runs
        if needs is None:  # as `flask` calls it: from DATABASE_URL alone up; each command says what it needs
            settings, problems = config.from_env_as_far_as_it_goes(environ)
        else:
            settings, problems = config.from_env(environ, needs), {}
    app.extensions[config.EXTENSION] = settings  # read with Settings.of(app)
    app.extensions[config.PROBLEMS] = problems  # why it was read below Needs.SERVICE (commands.needs says it)
    # Flask answers 413 past this; webhooks.py refuses the one byte more,
    # which it reads to tell a chunked body cut at the limit.
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes + 1
    logs.init_app(app)
    for warning in config.check_nesting(settings):
        app.logger.warning("timeouts do not nest: %s", warning)

    errors.init_app(app)
    delivery.init_app(app)
    db.init_app(app)
    release.init_app(app)
    lock.init_app(app)
    fetch.init_app(app)
    metrics.init_app(app)
    openapi.init_app(app)
    cli.init_app(app)
    users.init_app(app)
    payments.init_app(app)
    audit_cli.init_app(app)
    app.register_blueprint(webhooks.bp)
    return app
