"""Does the README hold on a fresh machine? In a new Debian bookworm container
(podman, the image test's Debian base) holding only the README's
prerequisites and a clone of HEAD: `make run`, the README's curl twice
(processed, then duplicate), Ctrl-C, then `make test`. Not part of `make
test` (it takes as long as the whole suite and more); run it by hand:

    .venv/bin/python scripts/fresh_machine_check.py [--keep-log DIR]

It prints each step's duration and exits non-zero at the first step that
fails. The image test is skipped inside (IMAGE_TEST=skip): podman does not
nest there, and the host's own `make test` runs it."""

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

# devservers is the checkout's, not the wheel's (it does not ship).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from devservers import ROOT, free_port, readme, wait_until
from devservers import image as images
from devservers.packages import ensure, program

SRC = "/src"  # the clone, inside the container
CONTAINER_ENV = {
    "IMAGE_TEST": "skip",
    "DEBIAN_FRONTEND": "noninteractive",
    # pip's TLS, as on this machine: the package index's certificates are re-signed here.
    "PIP_CERT": images.BUILD_CA,
}
# The servers' processes, to tell whether make run left any after Ctrl-C
# (apt-get may have started Debian's own PostgreSQL before): read from /proc
# (the prerequisites hold no procps) by a script on stdin, so that no command
# line but theirs holds the names.
LEFT_BEHIND = """
import pathlib, re
for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
    try:
        command = cmdline.read_bytes().replace(b"\\0", b" ").decode(errors="replace")
    except OSError:
        continue
    if re.search("postgres|redis-server|gunicorn", command):
        print(cmdline.parent.name, command)
"""
MAKE_TEST_TIMEOUT_S = 75 * 60  # the suite takes 15-25 min on a quiet machine; a shared one is slower
RUN_START_TIMEOUT_S = 300  # make run's first start creates the venv and installs the lock


def step(what, started):
    print(f"check: {what}: {time.monotonic() - started:.0f} s", flush=True)


def exec_in(name, script, timeout, env=None, **kw):
    env_args = [arg for key, value in (env or {}).items() for arg in ("--env", f"{key}={value}")]
    return subprocess.run([program("podman"), "exec", *env_args, name, "bash", "-euo", "pipefail", "-c", script],
                          env=images.podman_env(), timeout=timeout, **kw)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-log", type=Path, help="copy make run's and make test's logs here")
    args = parser.parse_args()
    begun = time.monotonic()
    if ensure("check") != 0:
        return 1
    base = images.debian_base()
    step(f"debian base {base}", begun)
    work = Path(tempfile.mkdtemp(prefix="webhook-ledger-fresh.", dir=images.CACHE))
    clone = work / "repo"
    subprocess.run(["git", "clone", "--quiet", "--branch", _branch(), str(ROOT), str(clone)], check=True)
    commit = subprocess.run(["git", "-C", str(clone), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=True).stdout.strip()
    name = f"webhook-ledger-fresh-{uuid.uuid4().hex[:8]}"
    ca = ["--volume", f"{images.HOST_CA}:{images.BUILD_CA}:ro"] if images.HOST_CA.exists() else []
    # Its own network (slirp4netns: no bridge here): its loopback ports are its own, as on a machine of its own,
    # not the host's, where other test suites pick free ports too.
    images.podman("run", "--detach", "--network", "slirp4netns", "--name", name, "--volume", f"{clone}:{SRC}", *ca,
                  *(arg for key, value in CONTAINER_ENV.items() for arg in ("--env", f"{key}={value}")),
                  base, "sleep", "infinity", timeout=120)
    try:
        return check(name, commit, work, args.keep_log)
    finally:
        images.podman("rm", "--force", "--time", "0", name, check=False, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
        step("in all", begun)


def _branch():
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--abbrev-ref", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def check(name, commit, work, keep_log):
    packages = readme.prerequisites()
    print(f"check: commit {commit}, in {name}; the README's packages: {' '.join(packages)}", flush=True)
    started = time.monotonic()
    exec_in(name, f"apt-get update -qq && apt-get install -y -qq {' '.join(packages)} >/dev/null",
            timeout=900, check=True)
    step("apt-get install of the README's packages", started)

    before = servers_running(name)
    port = free_port()
    run_log = work / "make-run.log"
    started = time.monotonic()
    # Its own process group, as in a terminal: Ctrl-C is a SIGINT to the group
    # (--wait: setsid forks when its caller leads a group, as podman exec does).
    runner = subprocess.Popen(
        [program("podman"), "exec", "--env", f"PORT={port}", name, "setsid", "--wait", "bash", "-c",
         f"echo $$ > /tmp/run.pgid; cd {SRC} && exec make run"],
        env=images.podman_env(), stdout=run_log.open("wb"), stderr=subprocess.STDOUT)
    base_url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: runner.poll() is not None or _answers(name, base_url), timeout=RUN_START_TIMEOUT_S,
                   interval=1, what="make run")
        if runner.poll() is not None:
            return _failed("make run exited before serving", run_log)
        step("make run, from nothing to serving", started)
        answers = [exec_in(name, readme.smoke_test(base_url), timeout=60, capture_output=True, text=True)
                   for _ in range(2)]
        said = [answer.stdout.strip() for answer in answers]
        print(f"check: the README's curl twice: {said}", flush=True)
        if said != ['{"event_id":"evt_demo_1","status":"processed"}',
                    '{"event_id":"evt_demo_1","status":"duplicate"}']:
            return _failed("the README's curl did not answer processed, then duplicate", run_log)
    finally:
        if runner.poll() is None:
            exec_in(name, "kill -INT -- -$(cat /tmp/run.pgid)", timeout=30)
            try:
                runner.wait(60)
            except subprocess.TimeoutExpired:
                return _failed("make run did not stop within 60 s of Ctrl-C", run_log)
    left = servers_running(name) - before
    if left:
        return _failed("Ctrl-C left processes behind:\n" + "\n".join(sorted(left)), run_log)
    print(f"check: make run stopped on Ctrl-C (exit {runner.returncode}), nothing left running", flush=True)

    test_log = work / "make-test.log"
    started = time.monotonic()
    with test_log.open("wb") as out:
        done = exec_in(name, f"cd {SRC} && make test", timeout=MAKE_TEST_TIMEOUT_S, env={"CI": "true"},
                       stdout=out, stderr=subprocess.STDOUT)
    step(f"make test (exit {done.returncode})", started)
    tail = test_log.read_text(errors="replace").splitlines()[-15:]
    print("\n".join(f"check:   {line}" for line in tail), flush=True)
    if keep_log:
        keep_log.mkdir(parents=True, exist_ok=True)
        for log in (run_log, test_log):
            (keep_log / log.name).write_bytes(log.read_bytes())
    return 0 if done.returncode == 0 else 1


def servers_running(name):
    listed = subprocess.run([program("podman"), "exec", "--interactive", name, "python3", "-"], input=LEFT_BEHIND,
                            env=images.podman_env(), capture_output=True, text=True, timeout=30, check=True)
    return set(listed.stdout.splitlines())


def _answers(name, base_url):
    probe = exec_in(name, f"curl -fsS {base_url}/health", timeout=30, capture_output=True)
    return probe.returncode == 0


def _failed(why, log):
    print(f"check: FAILED: {why}; last lines of {log.name}:", flush=True)
    print("\n".join(log.read_text(errors="replace").splitlines()[-30:]), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
