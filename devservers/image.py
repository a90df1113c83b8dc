"""Container images without a registry, for tests/deploy/test_image.py and
scripts/fresh_machine_check.py: a Debian bookworm base made from the apt
mirror by mmdebstrap, a Python base on it (Debian's python3 in a venv on
PATH, standing in for python:3.11-slim), and the project's Dockerfile built
on that. Bases are kept in podman's storage under a tag that hashes their
recipe, so a machine makes each once.

What this kind of machine needs from podman, none of it a change to the
image: runc (crun refuses the cgroup layout), ulimits that root may set, the
host's network (no bridge: no iptables), and pip's TLS through the host's CA
bundle, mounted for the build only."""

import contextlib
import fcntl
import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path

from . import ROOT
from .packages import program

CACHE = Path("/var/tmp/webhook-ledger-images")
CONTAINERS_CONF = """\
[containers]
# root may not raise its rlimits here; podman's defaults (1048576) exceed them.
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
"""
SUITE = "bookworm"
# The host's apt trusts its mirror's Release files past their Valid-Until; so must the chroot's.
MMDEBSTRAP = ["--variant=minbase", "--aptopt=Acquire::Check-Valid-Until \"false\"",
              "--dpkgopt=path-exclude=/usr/share/doc/*", "--dpkgopt=path-exclude=/usr/share/man/*",
              "--dpkgopt=path-exclude=/usr/share/locale/*"]
DEBIAN_REPO = "localhost/webhook-ledger-base/debian"
PYTHON_REPO = "localhost/webhook-ledger-base/python"
# Debian's python3 is 3.11 in bookworm, as python:3.11-slim's; the venv is
# what pip installs into, as /usr/local is in the official image.
PYTHON_CONTAINERFILE = """\
FROM {base}
RUN apt-get update \\
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \\
    && apt-get clean && rm -rf /var/lib/apt/lists/* \\
    && python3 -m venv /opt/python
ENV PATH=/opt/python/bin:$PATH
"""
# The host's CA bundle, where pip in a build finds it (PIP_CERT): the package
# index's TLS is re-signed on this machine's network. Never copied into an image.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_CA = "/run/host-ca.crt"


def podman_env():
    CACHE.mkdir(parents=True, exist_ok=True)
    conf = CACHE / "containers.conf"
    if not conf.exists() or conf.read_text() != CONTAINERS_CONF:
        conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def podman(*args, timeout=300, check=True, **kw):
    """podman with this machine's containers.conf; its output as text."""
    done = subprocess.run([program("podman"), *args], env=podman_env(), capture_output=True, text=True,
                          timeout=timeout, **kw)
    if check and done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(args[:2])} failed ({done.returncode}):\n"
                           f"{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def exists(image):
    done = subprocess.run([program("podman"), "image", "exists", image], env=podman_env(), capture_output=True)
    return done.returncode == 0


def _tag(repo, *recipe):
    return f"{repo}:{SUITE}-{hashlib.sha256(repr(recipe).encode()).hexdigest()[:12]}"


@contextlib.contextmanager
def _one_maker():
    """One process makes the bases at a time: a shared machine runs several test suites."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "make.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def debian_base(timings=None):
    """The minbase bookworm image's tag, made by mmdebstrap and imported if not cached."""
    tag = _tag(DEBIAN_REPO, MMDEBSTRAP)
    with _one_maker():
        if not exists(tag):
            started = time.monotonic()
            with tempfile.TemporaryDirectory(dir=CACHE) as work:
                tarball = Path(work) / "rootfs.tar"
                done = subprocess.run([program("mmdebstrap"), "--quiet", *MMDEBSTRAP, SUITE, str(tarball)],
                                      capture_output=True, text=True, timeout=600)
                if done.returncode != 0:
                    raise RuntimeError(f"mmdebstrap failed ({done.returncode}):\n{done.stderr[-3000:]}")
                podman("import", "--change", "CMD [\"/bin/bash\"]", str(tarball), tag, timeout=300)
            _note(timings, "debian base made", started)
    return tag


def python_base(timings=None):
    """The Python base's tag (made on debian_base if not cached)."""
    debian = debian_base(timings)
    containerfile = PYTHON_CONTAINERFILE.format(base=debian)
    tag = _tag(PYTHON_REPO, containerfile)
    with _one_maker():
        if not exists(tag):
            started = time.monotonic()
            with tempfile.TemporaryDirectory(dir=CACHE) as context:
                (Path(context) / "Containerfile").write_text(containerfile)
                podman("build", "--network", "host", "--format", "docker", "--tag", tag, context, timeout=600)
            _note(timings, "python base made", started)
    return tag


def build_app(tag, base, timings=None):
    """Build the project's Dockerfile on base; returns the image id."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        iidfile = Path(work) / "iid"
        ca = ["--build-arg", f"PIP_CERT={BUILD_CA}", "--volume", f"{HOST_CA}:{BUILD_CA}:ro"] if HOST_CA.exists() else []
        # --format docker: the OCI format has no HEALTHCHECK.
        podman("build", "--network", "host", "--format", "docker", "--build-arg", f"BASE_IMAGE={base}", *ca,
               "--iidfile", str(iidfile), "--tag", tag, str(ROOT), timeout=900)
        image = iidfile.read_text().strip()
    _note(timings, "app image built", started)
    return image


def size_mb(image):
    return int(podman("image", "inspect", "--format", "{{.Size}}", image, timeout=60)) / 1e6


def _note(timings, what, started):
    if timings is not None:
        timings[what] = time.monotonic() - started
