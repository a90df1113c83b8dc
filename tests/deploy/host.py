"""The wheel pip-installed on a host outside the checkout, as docs/deploying.md installs it (test_packaging.py,
test_systemd.py, test_reconcile_timer.py)."""

import subprocess
from dataclasses import dataclass
from pathlib import Path

# The default source's secret on such a host.
INSTALLED_SECRET = "installed-host-secret"


@dataclass(frozen=True)
class InstalledHost:
    """The wheel installed in a fresh virtualenv, its settings, and a working directory outside the checkout."""

    venv: Path
    env: dict
    workdir: Path
    db_url: str

    @property
    def gunicorn_conf(self):
        """Where the wheel puts gunicorn's settings: setup.cfg's data_files, under the environment's prefix."""
        return self.venv / "share" / "webhook-ledger" / "gunicorn.conf.py"

    def flask(self, *args):
        """Run `flask --app app <args>` on the host; return its output, asserting it succeeded."""
        done = subprocess.run([str(self.venv / "bin" / "flask"), "--app", "app", *args], cwd=self.workdir,
                              env=self.env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout


