"""Production's shape on loopback, for the topology tests and `make cluster`:
haproxy in front of 3 gunicorn hosts, PgBouncer in transaction pooling mode
in front of a private PostgreSQL, and a Redis Cluster of 3 primaries and 3
replicas. haproxy and PgBouncer run the files in deploy/, filled in only with
ports and paths."""

import contextlib
import csv
import os
import pwd
import secrets
import shutil
import signal
import socket
import string
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import redis

from . import ROOT, Gunicorn, Postgres, Redis, answers_tcp, free_port, wait_until
from .packages import program

DEPLOY = ROOT / "deploy"
DB_NAME = "webhook_ledger"  # the database deploy/pgbouncer.ini serves
APP_USER, STATS_USER = "ledger", "pgbouncer"  # the roles deploy/pgbouncer.ini names


def _as_user(name):
    """Popen arguments that run a server as name when we are root (PgBouncer refuses root)."""
    if os.geteuid() != 0:
        return {}
    entry = pwd.getpwnam(name)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": [], "cwd": "/"}


def _give(path, name):
    """Make path (a folder or a file) its server's, when we are root."""
    if os.geteuid() == 0:
        shutil.chown(path, name, pwd.getpwnam(name).pw_gid)


class PgBouncer:
    """deploy/pgbouncer.ini, its placeholders substituted as envsubst would,
    in front of PostgreSQL at pg_port. passwords: role -> password for its
    auth_file. Runs as `postgres` when we are root, as Debian's service does."""

    RUN_AS = "postgres"

    def __init__(self, base_dir, pg_port, passwords, port=None):
        self.dir = Path(base_dir)
        self.pg_port = pg_port
        self.passwords = passwords
        self.port = port or free_port()
        self.proc = None

    def render(self):
        values = {"PG_HOST": "127.0.0.1", "PG_PORT": self.pg_port, "PGBOUNCER_LISTEN_ADDR": "127.0.0.1",
                  "PGBOUNCER_PORT": self.port, "PGBOUNCER_RUN_DIR": self.dir,
                  "PGBOUNCER_AUTH_FILE": self.dir / "userlist.txt"}
        # substitute, not safe_substitute: a name left unfilled is an error, as with `envsubst -no-unset`.
        return string.Template((DEPLOY / "pgbouncer.ini").read_text()).substitute(values)

    def start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "pgbouncer.ini").write_text(self.render())
        userlist = self.dir / "userlist.txt"
        userlist.write_text("".join(f'"{user}" "{password}"\n' for user, password in self.passwords.items()))
        userlist.chmod(0o600)
        for path in (self.dir, userlist, self.dir / "pgbouncer.ini"):
            _give(path, self.RUN_AS)
        with open(self.dir / "pgbouncer.log", "ab") as log:
            self.proc = subprocess.Popen([program("pgbouncer"), str(self.dir / "pgbouncer.ini")], stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True, **_as_user(self.RUN_AS))
        wait_until(self._listening, what="pgbouncer")
        return self

    def _listening(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {self.proc.returncode} (log: {self.dir / 'pgbouncer.log'})")
        return answers_tcp(self.port)

    def url(self, user=APP_USER, dbname=DB_NAME):
        return f"postgresql://{user}:{self.passwords[user]}@127.0.0.1:{self.port}/{dbname}"

    def show(self, what):
        """The admin console's SHOW <what> as dicts (it speaks the simple query protocol only)."""
        with psycopg.connect(self.url(STATS_USER, "pgbouncer"), autocommit=True,
                             cursor_factory=psycopg.ClientCursor) as conn:
            cur = conn.execute(f"SHOW {what}")
            names = [column.name for column in cur.description]
            return [dict(zip(names, row, strict=True)) for row in cur]

    def stop(self, sig=signal.SIGTERM):
        """SIGTERM is PgBouncer's immediate shutdown: every client and server connection is cut."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)

    def restart(self):
        self.stop()
        return self.start()  # same port: the app's URL does not change


class HAProxy:
    """deploy/haproxy.cfg in front of servers (host:port strings), on port.
    Runs as `haproxy` when we are root and Debian's package made that user."""

    def __init__(self, base_dir, servers, port=None):
        self.dir = Path(base_dir)
        self.servers = servers
        self.port = port or free_port()
        self.proc = None

    def start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        # A byte-for-byte copy: the haproxy user may not be let into the checkout.
        config = shutil.copy(DEPLOY / "haproxy.cfg", self.dir / "haproxy.cfg")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HAPROXY_BIND": f"127.0.0.1:{self.port}",
               "HAPROXY_RUN_DIR": str(self.dir),
               **{f"APP_HOST_{i}": server for i, server in enumerate(self.servers, 1)}}
        user = {}
        with contextlib.suppress(KeyError):
            user = _as_user("haproxy")
            _give(self.dir, "haproxy")
        with open(self.dir / "haproxy.log", "ab") as log:
            self.proc = subprocess.Popen([program("haproxy"), "-db", "-f", str(config)], env=env, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True, **user)
        wait_until(lambda: set(self._states().values()) == {"UP"}, timeout=20, what="haproxy with every host UP")
        return self

    def _states(self):
        if self.proc.poll() is not None:
            raise RuntimeError(f"haproxy exited with {self.proc.returncode} (log: {self.dir / 'haproxy.log'})")
        try:
            return self.states()
        except OSError:
            return {}

    def stat(self):
        """`show stat` on the admin socket: one dict per frontend, backend and server."""
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(str(self.dir / "admin.sock"))
            s.sendall(b"show stat\n")
            data = b"".join(iter(lambda: s.recv(65536), b""))
        return list(csv.DictReader(data.decode().lstrip("# ").splitlines()))

    def states(self):
        """Each app host's state as haproxy's health checks see it: UP, DOWN, ..."""
        return {row["svname"]: row["status"].split(" ")[0] for row in self.stat()
                if row["pxname"] == "app" and row["svname"] not in ("FRONTEND", "BACKEND")}

    def sessions(self):
        """How many requests haproxy sent to each host so far (one session each here)."""
        return {row["svname"]: int(row["stot"]) for row in self.stat()
                if row["pxname"] == "app" and row["svname"] not in ("FRONTEND", "BACKEND")}

    def resent(self):
        """How many requests haproxy sent again (retry-on), and how many of those to another host."""
        (backend,) = (row for row in self.stat() if row["pxname"] == "app" and row["svname"] == "BACKEND")
        return int(backend["wretr"] or 0), int(backend["wredis"] or 0)

    @property
    def base(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class RedisCluster:
    """primaries x (1 + replicas) redis-server nodes in cluster mode under
    base_dir, joined by `redis-cli --cluster create`."""

    # A node is failed by the others after this long unreachable; 5 s rather
    # than 15 so that a dead primary is replaced within a test's patience.
    NODE_TIMEOUT_MS = 5000

    def __init__(self, base_dir, primaries=3, replicas=1):
        self.dir = Path(base_dir)
        self.replicas = replicas
        # The bus port is named, not port + 10000, which may be taken or past 65535.
        self.nodes = [Redis(self.dir / f"node{i + 1}", new_session=True, args=[
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(free_port()), "--cluster-node-timeout", str(self.NODE_TIMEOUT_MS)])
            for i in range(primaries * (1 + replicas))]

    def start(self):
        for node in self.nodes:
            node.workdir.mkdir(parents=True, exist_ok=True)
            node.start()
        subprocess.run([program("redis-cli"), "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                        "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        self.wait_healthy()
        return self

    def client(self, port):
        return redis.Redis(port=port, socket_timeout=2, decode_responses=True)

    def wait_healthy(self, timeout=30):
        """Every node says cluster_state:ok and every replica's link to its primary is up."""
        def healthy():
            for node in self.nodes:
                with self.client(node.port) as c:
                    if c.cluster("info")["cluster_state"] != "ok":
                        return False
                    info = c.info("replication")
                    if info["role"] == "slave" and info["master_link_status"] != "up":
                        return False
            return len(self.primaries()) == len(self.nodes) // (1 + self.replicas)

        wait_until(healthy, timeout=timeout, interval=0.2, what="redis cluster_state:ok on every node")

    def primaries(self):
        """Ports of the nodes that are primaries now."""
        return [node.port for node in self.nodes if self._role(node.port) == "master"]

    def replica_of(self, primary_port):
        with self.client(primary_port) as c:
            return int(c.info("replication")["slave0"]["port"])

    def primary_of(self, key):
        """Port of the primary that serves key's hash slot now."""
        with self.client(self.nodes[0].port) as c:
            slot = c.cluster("keyslot", key)
            for low, high, primary, *_ in c.execute_command("CLUSTER", "SLOTS"):
                if low <= slot <= high:
                    return int(primary[1])
        raise LookupError(key)

    def failover(self, replica_port):
        """CLUSTER FAILOVER on a replica: it and its primary swap roles, without losing a write.
        Returns once it is promoted; wait_healthy() then waits for the old primary to follow it."""
        with self.client(replica_port) as c:
            c.execute_command("CLUSTER", "FAILOVER")
        wait_until(lambda: self._role(replica_port) == "master", timeout=20, what=f"replica {replica_port} promoted")

    def _role(self, port):
        with self.client(port) as c:
            return c.info("replication")["role"]

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.nodes[0].port}/0"

    def stop(self):
        for node in self.nodes:
            node.stop()


class Topology:
    """haproxy -> 3 gunicorn hosts -> PgBouncer -> PostgreSQL, and a Redis
    Cluster, under base_dir. env: the app's settings (the secret...). prepare
    is called with the app role's direct conninfo before the hosts start
    (schema, users). Each server is stopped in reverse order by stop()."""

    def __init__(self, base_dir, env, hosts=3, workers=2, threads=4, port=None):
        self.dir = Path(base_dir)
        self.env, self.workers, self.threads = env, workers, threads
        self.host_ports = [free_port() for _ in range(hosts)]
        self.haproxy_port = port
        self.passwords = {APP_USER: secrets.token_hex(16), STATS_USER: secrets.token_hex(16)}
        self.pg = self.pgbouncer = self.redis = self.haproxy = None
        self.hosts = [None] * hosts
        self._stack = contextlib.ExitStack()

    def start(self, prepare=None):
        with self._stack as stack:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.dir.chmod(0o755)  # the servers' own users go through it to their folders
            self.pg = Postgres(self.dir / "pg")
            stack.callback(self.pg.stop, "immediate")
            self.pg.init().start()
            self._create_database(prepare)
            self.pgbouncer = PgBouncer(self.dir / "pgbouncer", self.pg.port, self.passwords)
            stack.callback(self.pgbouncer.stop)
            self.pgbouncer.start()
            self.redis = RedisCluster(self.dir / "redis")
            stack.callback(self.redis.stop)
            self.redis.start()
            stack.callback(self._stop_hosts)
            with ThreadPoolExecutor(len(self.hosts)) as pool:  # ~2 s each, mostly imports
                list(pool.map(self.start_host, range(len(self.hosts))))
            self.haproxy = HAProxy(self.dir / "haproxy", [f"127.0.0.1:{p}" for p in self.host_ports],
                                   self.haproxy_port)
            stack.callback(self.haproxy.stop)
            self.haproxy.start()
            self._stack = stack.pop_all()  # started: stop() runs these
        return self

    def _create_database(self, prepare):
        with psycopg.connect(self.pg.url(), autocommit=True) as conn:
            conn.execute(f"CREATE ROLE {APP_USER} LOGIN PASSWORD '{self.passwords[APP_USER]}'")
            conn.execute(f"CREATE DATABASE {DB_NAME} OWNER {APP_USER}")
        if prepare:
            prepare(f"postgresql://{APP_USER}@127.0.0.1:{self.pg.port}/{DB_NAME}")

    @property
    def app_env(self):
        """What every host is started with: through PgBouncer, on the Redis Cluster."""
        return {"DATABASE_URL": self.pgbouncer.url(), "REDIS_URL": self.redis.url, "REDIS_CLUSTER": "true",
                # PgBouncer 1.18 cannot route prepared statements in transaction mode.
                "PG_PREPARE_THRESHOLD": "off", **self.env}

    def start_host(self, i):
        """Start host i (again, on its port: haproxy's health checks bring it back)."""
        host_dir = self.dir / f"host{i + 1}"
        (host_dir / "metrics").mkdir(parents=True, exist_ok=True)
        self.hosts[i] = Gunicorn({**self.app_env, "PROMETHEUS_MULTIPROC_DIR": str(host_dir / "metrics")},
                                 self.workers, self.threads, log_path=host_dir / "gunicorn.log",
                                 port=self.host_ports[i])
        return self.hosts[i].start()

    def kill_host(self, i):
        """SIGKILL host i's master and workers at once: its process group, as a machine dying would."""
        proc = self.hosts[i].proc
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def _stop_hosts(self):
        for host in self.hosts:
            if host:
                host.stop()

    @property
    def base(self):
        return self.haproxy.base

    def processes(self):
        """Every process this topology started and that still runs, as name -> pid."""
        procs = {f"host{i + 1}": h.proc for i, h in enumerate(self.hosts) if h}
        procs["haproxy"] = self.haproxy and self.haproxy.proc
        procs["pgbouncer"] = self.pgbouncer and self.pgbouncer.proc
        procs.update({f"redis:{n.port}": n.proc for n in (self.redis.nodes if self.redis else [])})
        return {name: p.pid for name, p in procs.items() if p and p.poll() is None}

    def stop(self):
        self._stack.close()
