"""Log formatters shared by gunicorn.conf.py and app/logs.py, from the same records:
JSON lines for production, a short human line when the stream is a terminal.

A module of its own, outside the app package: gunicorn's master loads it for
logconfig_dict without importing the app (which would stop a HUP from loading
new code into the new workers).
"""

import logging

from pythonjsonlogger.orjson import OrjsonFormatter

# The fields of every JSON line, renamed: level, logger, pid, message, timestamp.
FORMAT = "%(levelname)s %(name)s %(process)d %(message)s"
RENAME = {"levelname": "level", "name": "logger", "process": "pid"}

# What every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def json_formatter():
    # orjson: the same JSON as the standard library's encoder, in a fraction
    # of the time (one line per delivery; docs/performance.md).
    return OrjsonFormatter(FORMAT, rename_fields=RENAME, timestamp=True)


class HumanFormatter(logging.Formatter):
    """`12:00:01 INFO  app.webhooks: delivery event_id=evt_1 outcome=processed ...`"""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)-5s %(name)s: %(message)s", datefmt="%H:%M:%S")

    def format(self, record):
        extras = " ".join(f"{key}={value}" for key, value in vars(record).items()
                          if key not in _STANDARD and value is not None)
        line = super().format(record)
        return f"{line} {extras}" if extras else line


def formatter_for(stream):
    """Human lines on a terminal (`make run`), JSON lines otherwise."""
    return HumanFormatter() if stream.isatty() else json_formatter()


def stdout_formatter():
    """logconfig_dict's factory for gunicorn's stdout handler."""
    import sys

    return formatter_for(sys.stdout)
