"""What the change feed's NOTIFY costs (docs/operations.md, "Following the journal").

pgbench, 8 clients, each transaction one adjust() (one journal row), on a throwaway cluster: with
webhook_ledger.feed_notify on, with the trigger and the setting off, and with no trigger, alternated ROUNDS times
(default 3). Run: .venv/bin/python scripts/feed_notify_bench.py
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

from app.store.db import apply_schema
from devservers import Postgres

PGBENCH = "/usr/lib/postgresql/15/bin/pgbench"
USERS = 1000
SCRIPT = ("\\set n random(1, 1000)\n"
          "SELECT adjust((SELECT user_id FROM user_balances ORDER BY user_id OFFSET :n - 1 LIMIT 1), 1, 'b', 'b');\n")
MODES = {  # the database's setting, and whether the trigger runs
    "notify": ("ALTER DATABASE bench SET webhook_ledger.feed_notify = on", "ENABLE"),
    "trigger": ("ALTER DATABASE bench RESET webhook_ledger.feed_notify", "ENABLE"),
    "none": ("ALTER DATABASE bench RESET webhook_ledger.feed_notify", "DISABLE"),
}


def main():
    base = tempfile.mkdtemp(prefix="feed-bench-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    server = Postgres(base).init().start()
    try:
        server.createdb("bench")
        url = server.url("bench")
        with psycopg.connect(url, autocommit=True) as conn:
            apply_schema(conn)
            conn.execute("INSERT INTO user_balances (user_id, balance_cents)"
                         " SELECT gen_random_uuid(), 0 FROM generate_series(1, %s)", [USERS])
        script = Path(base) / "adjust.sql"
        script.write_text(SCRIPT)
        script.chmod(0o644)
        for round_ in range(int(os.environ.get("ROUNDS", "3"))):
            for mode, (setting, trigger) in MODES.items():
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute(setting)
                    conn.execute(f"ALTER TABLE ledger_journal {trigger} TRIGGER ledger_journal_notify")
                done = subprocess.run(["runuser", "-u", "postgres", "--", PGBENCH, "-n", "-c", "8", "-j", "2",
                                       "-T", "8", "-f", str(script), url], capture_output=True, text=True, cwd="/")
                tps = re.search(r"tps = ([\d.]+)", done.stdout)
                print(f"round {round_} {mode:8} tps={tps.group(1) if tps else done.stderr[-300:]}", flush=True)
    finally:
        server.stop("immediate")


if __name__ == "__main__":
    main()
