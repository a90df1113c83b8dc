"""What `make run` and `make cluster` share around their servers: a supervisor
that stops everything a script started however it ends (a return, a failure,
Ctrl-C, SIGTERM or SIGHUP), output that a vanished terminal cannot interrupt,
and the port check before anything starts."""

import contextlib
import os
import signal
import socket

from . import children

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Failed(Exception):
    """Start-up cannot go on; the message says why and what to do."""


class Stopped(Exception):
    """A signal asked us to stop; we exit with 128 + its number, as a shell does."""


def say(text, fd=1):
    # os.write, unbuffered: a terminal that is gone (a Ctrl-C'd `| tee`, a
    # hung-up tty) must not stop the clean-up, nor leave output to flush at exit.
    try:
        os.write(fd, text.encode())
    except OSError:
        pass


def logger(name):
    """A function that writes "name: message" lines to stderr."""
    def log(message):
        say(f"{name}: {message}\n", fd=2)
    return log


def supervise(run, log):
    """Run run(cleanup) until it returns, fails or a signal stops it; return the exit status.

    Each server's stop is pushed on cleanup as it starts; they run in reverse
    on the way out, whatever the way out is.
    """
    for sig in STOP_SIGNALS:
        signal.signal(sig, _stop_on_signal)
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(_stop_stray_children, log)
        try:
            return run(cleanup)
        except Stopped as stop:
            return 128 + stop.args[0]
        except Failed as failure:
            log(f"error: {failure}")
            return 1
        finally:
            for sig in STOP_SIGNALS:
                signal.signal(sig, signal.SIG_IGN)


def _stop_on_signal(signum, frame):
    for sig in STOP_SIGNALS:  # a second Ctrl-C must not interrupt the clean-up
        signal.signal(sig, signal.SIG_IGN)
    raise Stopped(signum)


def _stop_stray_children(log):
    """A signal that lands inside Popen() loses the new child's pid, but it is still our child."""
    for pid in children(os.getpid()):
        log(f"stopping pid {pid}")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
            os.waitpid(pid, 0)


def port_free(host, port):
    # SO_REUSEADDR as gunicorn sets it: a port in TIME_WAIT after the last run is free.
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError:
            return False
    return True
