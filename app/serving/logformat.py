"""Log formatters shared by gunicorn.conf.py and app/receiver/logs.py: JSON lines, or a human line on a terminal.
It imports nothing of the app: gunicorn's master loads it by its path (docs/operations.md, "Logs")."""

import logging
import re
from typing import TextIO

from pythonjsonlogger.orjson import OrjsonFormatter

# The fields of every JSON line, renamed: level, logger, pid, message, timestamp.
FORMAT = "%(levelname)s %(name)s %(process)d %(message)s"
RENAME = {"levelname": "level", "name": "logger", "process": "pid"}

# What every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def json_formatter() -> logging.Formatter:
    # orjson: the same JSON as the standard library's encoder, in a fraction
    # of the time (one line per delivery; docs/performance.md).
    return OrjsonFormatter(FORMAT, rename_fields=RENAME, timestamp=True)


class HumanFormatter(logging.Formatter):
    """`12:00:01 INFO  app.receiver.webhooks: delivery event_id=evt_1 outcome=processed ...`, each value written so
    that none a sender controls can start a line, colour the terminal or pass for another field."""
    # Control characters are escaped as in the JSON lines, and a value with a space, a quote or an `=` is quoted.

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-5s %(name)s: %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        record.message = record.getMessage()
        record.asctime = self.formatTime(record, self.datefmt)
        fields = [self.formatMessage(record).translate(_ESCAPES)]
        fields += [f"{key}={_value(value)}" for key, value in vars(record).items()
                   if key not in _STANDARD and value is not None]
        line = " ".join(fields)
        # A traceback keeps its lines, indented: every line at the margin starts a record.
        for text in (record.exc_info and self.formatException(record.exc_info),
                     record.stack_info and self.formatStack(record.stack_info)):
            if text:
                line += "".join(f"\n    {part.translate(_ESCAPES)}" for part in text.splitlines())
        return line


# C0 and C1 controls, DEL, and the line separators and bidirectional overrides
# that a terminal also acts on: written as JSON escapes (\n, \u001b, ...).
_CONTROLS = [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {c: {0x0A: "\\n", 0x0D: "\\r", 0x09: "\\t"}.get(c, f"\\u{c:04x}") for c in _CONTROLS}
# Written as they are; any other string is quoted.
_BARE = re.compile(r"[A-Za-z0-9._:/@+,%-]+")


def _value(value: object) -> str:
    if isinstance(value, (int, float)):  # bool too
        return str(value)
    text = str(value)
    if _BARE.fullmatch(text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').translate(_ESCAPES) + '"'


def formatter_for(stream: TextIO) -> logging.Formatter:
    """Human lines on a terminal (`make run`), JSON lines otherwise."""
    return HumanFormatter() if stream.isatty() else json_formatter()


def stdout_formatter() -> logging.Formatter:
    """logconfig_dict's factory for gunicorn's stdout handler."""
    import sys

    return formatter_for(sys.stdout)
