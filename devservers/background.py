"""A devservers module's stand-ins run in the background for the docs' recipes: `python -m <module> start` spawns
`python -m <module> serve`, returns once its ports answer and keeps its pid in a folder (with its log);
`python -m <module> stop` stops it. devservers/paypal_local.py and stripe_local.py are two."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import ROOT, answers_tcp

START_SECONDS = 30


def shown(path):
    """path as the docs print it: relative to the checkout when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def wait_for_signal():
    """Block until SIGTERM or SIGINT (a background `serve`'s life)."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()


class Background:
    """module's `serve`, in the background from folder (its pid file and log); what names it in the lines
    printed ("Stripe's stand-in", "PayPal's stand-ins": are, for the plural)."""

    def __init__(self, module: str, folder: Path, what: str, plural: bool = False) -> None:
        self.module, self.folder, self.what = module, folder, what
        self.are = "are" if plural else "is"

    def running(self):
        """The pid of the `serve` started from the folder, if it still runs."""
        try:
            pid = int((self.folder / "pid").read_text())
            running = self.module in Path(f"/proc/{pid}/cmdline").read_text()
        except (OSError, ValueError):
            return None
        return pid if running else None

    def stop(self):
        pid = self.running()
        if pid is None:
            return f"{self.what} {self.are} not running"
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + START_SECONDS
        while self.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        (self.folder / "pid").unlink(missing_ok=True)
        return f"stopped {self.what}"

    def spawn(self, ports):
        """Start `serve` (stopping that of an earlier start) and wait until every port answers; SystemExit with
        its log's path if it does not."""
        self.stop()
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / "log", "ab") as log:
            server = subprocess.Popen([sys.executable, "-m", self.module, "serve"], cwd=ROOT,
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + START_SECONDS
        while not all(answers_tcp(port) for port in ports):
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                its = "their" if self.are == "are" else "its"
                raise SystemExit(f"{self.what} did not start; {its} log: {shown(self.folder / 'log')}")
            time.sleep(0.05)
        (self.folder / "pid").write_text(f"{server.pid}\n")
