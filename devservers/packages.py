"""The one list of the Debian packages that the tests, `make cluster` and
`make bench` run, beyond the README's prerequisites: each program -> its
package. `make test` and `make cluster` run `python -m devservers.packages
<group>`, which installs what is missing when it may (root and apt-get) and
otherwise names the packages in one line; `make bench` only names them.
Standard library only: it runs before anything else is installed."""

import os
import shutil
import subprocess
import sys

from . import pg_bindir

# program -> Debian package. Debian keeps haproxy and pgbouncer in /usr/sbin,
# off a non-root user's PATH; find() looks there too.
SERVERS = {
    "redis-server": "redis-server",
    "redis-cli": "redis-tools",  # creates the Redis Cluster of the topology tests and `make cluster`
    "haproxy": "haproxy",  # the load balancer of the topology tests and `make cluster`
    "pgbouncer": "pgbouncer",  # the pooler, ditto
    "promtool": "prometheus",  # checks and unit-tests deploy/prometheus/alerts.yml
    "prometheus": "prometheus",  # scrapes the app for every query of deploy/grafana/ (test_dashboard.py)
    "systemd-analyze": "systemd",  # verifies deploy/systemd/ (test_systemd.py)
    "systemd-socket-activate": "systemd",  # hands the socket unit's socket to gunicorn, as systemd would
    "runuser": "util-linux",  # runs PostgreSQL as `postgres` when we are root
    "pgrep": "procps",  # test_cluster.py looks for what `make cluster` left running
}
# tests/deploy/test_image.py: podman with runc (crun refuses the cgroup layout of
# this project's machines), mmdebstrap to make a Debian base image from the
# apt mirror (there is no registry of images to pull from), and the README's
# curl, which it sends to the container.
IMAGE = {"podman": "podman", "runc": "runc", "mmdebstrap": "mmdebstrap", "curl": "curl", "openssl": "openssl"}
# `make bench`: its load generator, and the peer receiver (Node) with the
# npm that sets it up. Named when missing, never installed by the bench.
BENCH = {"wrk": "wrk", "node": "nodejs", "npm": "npm"}
GROUPS = {
    "test": {**SERVERS, **IMAGE},
    "cluster": {name: SERVERS[name] for name in ("redis-server", "redis-cli", "haproxy", "pgbouncer")},
    # scripts/fresh_machine_check.py: its container gets a network of its own
    # from slirp4netns (no bridge here), so its tests' ports race no one else's.
    "check": {**{name: IMAGE[name] for name in ("podman", "runc", "mmdebstrap")}, "slirp4netns": "slirp4netns"},
    "bench": BENCH,
}
# On a shared machine another apt-get may hold dpkg's lock: wait for it.
APT_LOCK_WAIT_SECONDS = 600


def find(name):
    """A program's path, or None."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def program(name):
    """A program's path; RuntimeError naming its package when it is missing."""
    found = find(name)
    if not found:
        raise RuntimeError(f"{name} not found (Debian: apt-get install {package(name)})")
    return found


def package(name):
    return {**SERVERS, **IMAGE, **BENCH}.get(name, name)


def image_test_skipped():
    """IMAGE_TEST=skip: where podman cannot run, e.g. inside the container of
    scripts/fresh_machine_check.py (podman does not nest there)."""
    return os.environ.get("IMAGE_TEST", "").strip().lower() == "skip"


def missing(programs):
    """The packages of the programs not found, in the list's order, and PostgreSQL's when it is missing."""
    found = []
    try:
        pg_bindir()
    except RuntimeError:
        found.append("postgresql")
    for name, deb in programs.items():
        if not find(name) and deb not in found:
            found.append(deb)
    return found


def how_to_install(packages):
    return f"{' '.join(packages)} (as root: apt-get install {' '.join(packages)})"


def may_install():
    return os.geteuid() == 0 and shutil.which("apt-get") is not None


def apt_install(packages):
    """apt-get update and install, quiet unless it fails (dpkg's progress is hundreds of lines)."""
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    wait = f"DPkg::Lock::Timeout={APT_LOCK_WAIT_SECONDS}"
    for command in (["apt-get", "update", "-qq", "-o", wait],
                    ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "-o", wait, *packages]):
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:2])} failed ({done.returncode}):\n{done.stdout[-3000:]}"
                               f"{done.stderr[-3000:]}")


def ensure(group):
    """Install what the group needs and lacks, if we may (the image test's
    packages unless IMAGE_TEST=skip). Returns the exit status: 1 when a server
    is still missing; a missing image package only skips the image test."""
    programs = dict(GROUPS[group])
    if group == "test" and image_test_skipped():
        programs = {name: deb for name, deb in programs.items() if name not in IMAGE}
    needed = missing(programs)
    if needed and may_install():
        sys.stderr.write(f"installing {' '.join(needed)} (apt-get)...\n")
        try:
            apt_install(needed)
        except RuntimeError as exc:
            sys.stderr.write(f"{exc}\n")
            return 1
        needed = missing(programs)
    if not needed:
        return 0
    optional = set(IMAGE.values()) if group == "test" else set()
    what = "missing Debian packages" if set(needed) - optional else "the image test will be skipped, missing"
    sys.stderr.write(f"{what}: {how_to_install(needed)}\n")
    return 1 if set(needed) - optional else 0


if __name__ == "__main__":
    sys.exit(ensure(sys.argv[1] if len(sys.argv) > 1 else "test"))
