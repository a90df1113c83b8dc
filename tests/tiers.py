"""The test tiers, by what a test needs (docs/testing.md). A module declares its tier with `pytestmark`; a test
of a core or deploy module that starts no process is marked `unit` itself. conftest.py applies these rules."""

import os

# unit: no server and no process of its own: it runs in pytest's. core: processes of its own (a throwaway PostgreSQL
# and Redis, gunicorn, `flask`, a script), no root and no apt. deploy: the deployment's servers and artefacts.
TIERS = ("unit", "core", "deploy")

# The fixtures that start a server. A unit test asks for none of them.
SERVER_FIXTURES = {"pg_server", "postgresql", "redis_server", "gunicorn", "installed_venv", "paypal_api_server"}
# The fixtures of the deploy tier: a wheel, built and pip-installed on a host. A core test asks for none of them.
DEPLOY_FIXTURES = {"wheel", "installed_venv", "installed_host"}

# The programs of devservers/packages.py that come with the README's prerequisites: redis-cli with
# redis-server (Debian's redis-server depends on redis-tools), runuser with util-linux (essential), curl and
# openssl with the README's smoke test, pgrep with procps (Debian's priority "important").
CORE_PROGRAMS = {"redis-server", "redis-cli", "runuser", "pgrep", "curl", "openssl"}
# The others: the deploy tier's. `make test-deploy` installs them; a unit or core test that runs one fails.
DEPLOY_PROGRAMS = {"haproxy", "pgbouncer", "promtool", "prometheus", "systemd-analyze", "systemd-socket-activate",
                   "podman", "runc", "mmdebstrap"}


def tier(item):
    """The test's tier: unit when it is marked unit, else its module's; None when its module declares none."""
    if item.get_closest_marker("unit"):
        return "unit"
    return next((mark.name for mark in item.iter_markers() if mark.name in TIERS), None)


def refused_fixtures(test_tier, fixturenames):
    """The fixtures that a test of this tier may not ask for, sorted."""
    refused = {"unit": SERVER_FIXTURES | DEPLOY_FIXTURES, "core": DEPLOY_FIXTURES}.get(test_tier, set())
    return sorted(refused & set(fixturenames))


def program(executable, args):
    """The name of the program that subprocess.Popen(args, executable=executable) runs."""
    if executable is None:
        if isinstance(args, str | bytes):
            executable = args.split()[0] if args.split() else args  # a command line: its first word
        else:
            executable = args if isinstance(args, os.PathLike) else args[0]
    return os.path.basename(os.fsdecode(executable))


def refused_program(test_tier, name):
    """Why a test of this tier may not run the program, or None when it may."""
    if test_tier in ("unit", "core") and name in DEPLOY_PROGRAMS:
        return f"a {test_tier} test runs {name}, a program of the deploy tier: mark the module deploy (docs/testing.md)"
    if test_tier == "unit":
        return f"a unit test runs {name}: a test that starts a process is core or deploy (docs/testing.md)"
    return None
