"""gunicorn's entry point: `gunicorn -c gunicorn.conf.py wsgi:app`."""

import sys

from app import create_app
from app.core.errors import ConfigError
from app.receiver import drain
from app.settings.config import Needs

# gunicorn's Arbiter.WORKER_BOOT_ERROR: a worker that exits with it makes the
# master stop (any other status, and the master starts another worker, for
# ever). gunicorn.conf.py checks the settings in the master first, so this
# is the second line, for a worker that a HUP started with new code.
WORKER_BOOT_ERROR = 3

try:
    app = create_app(needs=Needs.SERVICE)  # serving reads every setting: a missing one stops it
except ConfigError as exc:
    # A one-line reason, not a traceback, is what an operator needs here.
    sys.stderr.write(f"webhook-ledger: {exc.format_message()}\n")
    sys.stderr.flush()
    sys.exit(WORKER_BOOT_ERROR)

# The drain applies accepted notifications (app/receiver/drain.py): a thread of this worker, started here because
# gunicorn imports this module in each worker after the fork (preload_app is off), so every shipped way to run the
# service (make run, the image, compose, systemd: all gunicorn -c gunicorn.conf.py wsgi:app) runs it.
drain.start(app)
