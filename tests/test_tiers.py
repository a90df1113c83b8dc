"""Every test is in one tier, and the tiers below deploy need nothing of it (tests/tiers.py, docs/testing.md):
each module declares its tier; only `unit` is marked test by test; a unit or core module imports none of the
deploy tier's servers, fixtures or modules; and the hooks of conftest.py refuse, for real, what a tier may not
start (a unit test, any process)."""

import ast
import functools
import subprocess
import sys
from types import SimpleNamespace

import pytest
from xdist.scheduler.loadgroup import LoadGroupScheduling

from devservers import ROOT
from devservers.packages import IMAGE, SERVERS

from . import conftest, tiers

pytestmark = pytest.mark.unit

TESTS = ROOT / "tests"
MODULES = sorted(TESTS.rglob("test_*.py"))
# The deploy tier's folder: its modules, its fixtures (conftest.py) and its helpers (host.py).
DEPLOY = TESTS / "deploy"
# What devservers gives the deploy tier alone: haproxy, PgBouncer, production's topology, Prometheus, the image.
DEPLOY_IMPORTS = {"devservers.topology": {"HAProxy", "PgBouncer", "Topology"}, "devservers": {"Prometheus", "image"},
                  "devservers.image": {"*"}}


@functools.cache
def tree(path):
    return ast.parse(path.read_text(), str(path))


def mark_names(node):
    """The names of the pytest.mark.<name> that an expression holds (a mark, a list of marks, a call of one)."""
    return {sub.attr for sub in ast.walk(node)
            if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute) and sub.value.attr == "mark"}


def declared_tiers(path):
    """The tiers that the module's top-level pytestmark names."""
    marks = [mark_names(node.value) for node in tree(path).body if isinstance(node, ast.Assign)
             and any(isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)]
    return [name for names in marks for name in sorted(names) if name in tiers.TIERS]


def name(path):
    return str(path.relative_to(TESTS))


def module_tiers():
    return {name(path): declared_tiers(path) for path in MODULES}


def test_every_test_module_declares_one_tier():
    wrong = {name: found for name, found in module_tiers().items() if len(found) != 1}
    assert wrong == {}, "each test module needs pytestmark = pytest.mark.unit, core or deploy"


def test_a_module_declares_deploy_exactly_when_it_is_in_the_deploy_folder():
    misplaced = {name(path): declared_tiers(path) for path in MODULES
                 if (declared_tiers(path) == ["deploy"]) != (DEPLOY in path.parents)}
    assert misplaced == {}, "a deploy module lives in tests/deploy/, and only a deploy module does"


def test_only_unit_is_marked_test_by_test():
    """A test's own tier mark can only move it down to unit: a core test in a deploy module would hide there."""
    found = {}
    for path in MODULES:
        for node in ast.walk(tree(path)):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                marks = set().union(*(mark_names(decorator) for decorator in node.decorator_list))
                if marks & {"core", "deploy"}:
                    found[f"{name(path)}::{node.name}"] = sorted(marks & {"core", "deploy"})
    assert found == {}


def imported_module(path, node):
    """The absolute name of the module that an ImportFrom in the test module at path imports."""
    package = ".".join(path.relative_to(ROOT).parent.parts)
    if not node.level:
        return node.module
    package = package.rsplit(".", node.level - 1)[0]  # each dot past the first goes one package up
    return f"{package}.{node.module}" if node.module else package


def deploy_dependencies(path):
    """What the module takes of the deploy tier: imports, fixtures asked for, programs named in a call."""
    found = set()
    for node in ast.walk(tree(path)):
        if isinstance(node, ast.ImportFrom):
            module = imported_module(path, node)
            names = {alias.name for alias in node.names}
            taken = DEPLOY_IMPORTS.get(module, set())
            found |= {f"{module}.{name}" for name in names if name in taken or "*" in taken}
            if module.startswith("tests.deploy"):
                found.add(module)
            elif module == "tests" and "deploy" in names:
                found.add("tests.deploy")
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names
                      if alias.name in DEPLOY_IMPORTS or alias.name.startswith("tests.deploy")}
        elif isinstance(node, ast.FunctionDef):
            found |= {f"fixture {arg.arg}" for arg in node.args.args if arg.arg in tiers.DEPLOY_FIXTURES}
        elif isinstance(node, ast.Call):
            found |= {f"program {arg.value}" for arg in ast.walk(node)
                      if isinstance(arg, ast.Constant) and arg.value in tiers.DEPLOY_PROGRAMS}
    return found


def test_no_module_below_deploy_takes_anything_of_the_deploy_tier():
    # This module names the deploy tier's programs as data.
    taken = {name(path): sorted(deploy_dependencies(path)) for path in MODULES
             if declared_tiers(path) != ["deploy"] and path.name != "test_tiers.py"}
    assert {name: found for name, found in taken.items() if found} == {}


def test_the_check_finds_what_a_deploy_module_takes():
    """The check above can fail: it finds the deploy tier in the modules that need it."""
    assert "devservers.topology.HAProxy" in deploy_dependencies(DEPLOY / "test_haproxy.py")
    assert "fixture installed_host" in deploy_dependencies(DEPLOY / "test_systemd.py")
    assert "tests.deploy.test_systemd" in deploy_dependencies(DEPLOY / "test_reconcile_timer.py")
    assert "tests.deploy.host" in deploy_dependencies(DEPLOY / "test_packaging.py")


def test_every_program_of_the_package_list_is_in_a_tier():
    """A program added to devservers/packages.py says which tier needs it."""
    listed = set(SERVERS) | set(IMAGE)
    assert tiers.CORE_PROGRAMS.isdisjoint(tiers.DEPLOY_PROGRAMS)
    assert tiers.CORE_PROGRAMS | tiers.DEPLOY_PROGRAMS == listed


@pytest.mark.parametrize("tier, fixtures, refused", [
    ("unit", {"tmp_path", "make_app"}, []),
    ("unit", {"postgresql", "db", "redis_server"}, ["postgresql", "redis_server"]),
    ("core", {"db", "gunicorn", "redis_server"}, []),
    ("core", {"gunicorn", "installed_host", "installed_venv", "wheel"}, ["installed_host", "installed_venv", "wheel"]),
    ("deploy", {"installed_host", "installed_venv", "wheel", "pg_server"}, []),
])
def test_each_tier_is_refused_the_fixtures_beyond_it(tier, fixtures, refused):
    assert tiers.refused_fixtures(tier, fixtures) == refused


@pytest.mark.parametrize("executable, args, name", [
    (None, ["/usr/sbin/haproxy", "-db", "-f", "x.cfg"], "haproxy"),
    (None, "pgbouncer /tmp/pgbouncer.ini", "pgbouncer"),
    ("/usr/bin/podman", ["podman", "run"], "podman"),
    (None, [ROOT / "scripts" / "run.py"], "run.py"),
    (None, [b"/usr/bin/redis-server", b"--port", b"0"], "redis-server"),
])
def test_the_program_a_popen_runs_is_named(executable, args, name):
    assert tiers.program(executable, args) == name


@pytest.mark.parametrize("tier, program", [("core", "haproxy"), ("unit", "promtool")])
def test_a_unit_or_core_test_is_refused_a_deploy_program(tier, program):
    assert "deploy tier" in tiers.refused_program(tier, program)


@pytest.mark.parametrize("program", ["python3", "gunicorn", "flask", "sh", "redis-server"])
def test_a_unit_test_is_refused_any_program(program):
    assert "a test that starts a process is core or deploy" in tiers.refused_program("unit", program)


@pytest.mark.parametrize("tier, program", [("core", "redis-server"), ("core", "python3"), ("deploy", "haproxy")])
def test_a_test_may_run_a_program_of_its_own_tier(tier, program):
    assert tiers.refused_program(tier, program) is None


def test_this_unit_test_may_not_start_haproxy():
    """conftest.py's audit hook stops the Popen before anything runs, whether or not haproxy is installed."""
    with pytest.raises(RuntimeError, match="a unit test runs haproxy, a program of the deploy tier"):
        subprocess.Popen(["haproxy", "-v"])


def test_this_unit_test_may_not_start_python():
    """Nor any other program: a unit test runs in pytest's process alone (`make check`'s budget)."""
    with pytest.raises(RuntimeError, match="a unit test runs python.*: a test that starts a process is core"):
        subprocess.Popen([sys.executable, "-c", "pass"])


# -- `make test`'s workers (pytest-xdist, --dist loadgroup) ------------------------

def test_an_xdist_group_is_scheduled_as_one(request):
    """A test marked xdist_group(name) goes to the worker of its group under `make test`'s --dist loadgroup.

    pytest-xdist 3.8 tells its scheduler the group as an `@name` suffix of the test's id, which it sets where
    pytest 9.2 no longer reads it (pytest-dev/pytest-xdist#1386); conftest.py's pytest_collection_modifyitems
    sets it again. Without it the groups were spread over the workers, and nothing said so."""
    grouped, free = (pytest.Function.from_parent(request.node.parent, name=name, callobj=lambda: None)
                     for name in ("grouped_probe", "free_probe"))
    grouped.add_marker(pytest.mark.xdist_group("one"))
    a_worker = SimpleNamespace(option=SimpleNamespace(loadgroup=True))  # what xdist sets in each worker
    conftest.pytest_collection_modifyitems(a_worker, [grouped, free])
    scheduler = LoadGroupScheduling.__new__(LoadGroupScheduling)  # the scope of an id needs no session
    assert scheduler._split_scope(grouped.nodeid) == "one", grouped.nodeid
    assert scheduler._split_scope(free.nodeid) == free.nodeid  # a test of its own
