#!/usr/bin/env bash
# `make run`: the service on http://127.0.0.1:8000 (or $PORT), ready to be sent
# a signed webhook.
#
# With DATABASE_URL and REDIS_URL both set, those servers are used. Otherwise
# a private, throwaway PostgreSQL cluster and redis-server are started on free
# loopback ports, under .run/ (git-ignored). Either way the schema is applied
# (`flask --app app init-db`, idempotent), a demo user is created, and gunicorn
# runs with the committed gunicorn.conf.py. Ctrl-C (or SIGTERM) stops
# everything this script started, and nothing else.
#
# The Makefile puts the virtualenv's bin/ first on PATH; run it as `make run`.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
RUN_DIR=$ROOT/.run
DEMO_USER=00000000-0000-4000-8000-000000000001
DEMO_SECRET=dev-secret-change-me
DB_NAME=webhook_ledger

log() { printf 'run: %s\n' "$*" >&2; }
die() { printf 'run: error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- cleanup
# Whatever was started is recorded here and stopped by cleanup(), on Ctrl-C,
# SIGTERM, SIGHUP, an error, or gunicorn exiting by itself.
GUNICORN_PID=""
REDIS_PID=""
PG_DATA=""        # set just before `pg_ctl start`: stop it even if interrupted
TMP_DIRS=()       # folders under /tmp (see below), removed on exit
AS_PG=()          # `runuser -u postgres --` when we are root
PG_BIN=""

cleanup() {
    local status=$?
    # Finish cleaning up even if Ctrl-C is pressed again, or if the terminal
    # or pipe that our messages go to is gone.
    trap '' INT TERM HUP PIPE
    trap - EXIT
    set +e
    if [[ -n $GUNICORN_PID ]] && kill -0 "$GUNICORN_PID" 2>/dev/null; then
        log "stopping gunicorn (pid $GUNICORN_PID)"
        kill -TERM "$GUNICORN_PID" 2>/dev/null || true
        wait "$GUNICORN_PID" 2>/dev/null || true
    fi
    if [[ -n $REDIS_PID ]]; then
        log "stopping redis-server (pid $REDIS_PID)"
        kill -TERM "$REDIS_PID" 2>/dev/null || true
        wait "$REDIS_PID" 2>/dev/null || true
        rm -f "$RUN_DIR/redis.pid"
    fi
    if [[ -n $PG_DATA ]]; then
        log "stopping PostgreSQL"
        # pg_ctl starts it in its own session, out of reach of Ctrl-C.
        as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >/dev/null 2>&1 || true
    fi
    if ((${#TMP_DIRS[@]})); then
        rm -rf "${TMP_DIRS[@]}"
    fi
    if [[ $(cat "$RUN_DIR/run.pid" 2>/dev/null) == "$$" ]]; then
        rm -f "$RUN_DIR/run.pid"
    fi
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT    # exit runs the EXIT trap, i.e. cleanup
trap 'exit 143' TERM
trap 'exit 129' HUP    # the terminal was closed

# ---------------------------------------------------------------- helpers
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# port_free HOST PORT: whether gunicorn could listen there (it sets
# SO_REUSEADDR, so a port in TIME_WAIT after a previous run counts as free).
port_free() {
    python3 - "$1" "$2" <<'EOF'
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((host, port))
    s.listen(1)
except OSError:
    sys.exit(1)
EOF
}

# wait_for WHAT SECONDS COMMAND...: retry COMMAND until it succeeds.
wait_for() {
    local what=$1 seconds=$2 i
    shift 2
    for ((i = 0; i < seconds * 10; i++)); do
        if "$@" >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    die "$what did not come up within ${seconds}s"
}

redis_answers() {
    python3 - "$1" <<'EOF'
import socket, sys
with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.5) as s:
    s.sendall(b"PING\r\n")
    sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
EOF
}

http_ok() {
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' "$1"
}

gunicorn_alive_and_healthy() {
    kill -0 "$GUNICORN_PID" 2>/dev/null || die "gunicorn exited during start-up (see its log above)"
    http_ok "$1"
}

# as_pg COMMAND...: run a PostgreSQL server command, as the postgres user
# when we are root; from /, since that user may not be allowed in our cwd.
as_pg() {
    (cd / && "${AS_PG[@]}" "$@")
}

# The folder holding pg_ctl and initdb: pg_ctl's on PATH (through symlinks,
# e.g. /usr/local/bin/pg_ctl -> /usr/lib/postgresql/15/bin/pg_ctl), else the
# newest /usr/lib/postgresql/*/bin (Debian and Ubuntu keep them off PATH).
find_pg_bin() {
    local dir candidates=()
    if dir=$(command -v pg_ctl); then
        candidates+=("$(dirname "$(readlink -f "$dir")")")
    fi
    while IFS= read -r dir; do
        candidates+=("$dir")
    done < <(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV)
    for dir in "${candidates[@]}"; do
        if [[ -x $dir/pg_ctl && -x $dir/initdb ]]; then
            printf '%s\n' "$dir"
            return
        fi
    done
    die "PostgreSQL server binaries (pg_ctl, initdb) not found: install postgresql, or set DATABASE_URL and REDIS_URL"
}

# ---------------------------------------------------------------- checks
command -v gunicorn >/dev/null && command -v flask >/dev/null \
    || die "gunicorn/flask not found on PATH; start this with \`make run\` (it sets up .venv)"
command -v psql >/dev/null || die "psql not found (install the PostgreSQL client)"

export PORT=${PORT:-8000}
# gunicorn.conf.py binds $BIND if set, else 127.0.0.1:$PORT.
BIND_ADDR=${BIND:-127.0.0.1:$PORT}
[[ $BIND_ADDR == *:* && $BIND_ADDR != unix:* ]] || die "BIND must be host:port for make run, got '$BIND_ADDR'"
HTTP_PORT=${BIND_ADDR##*:}
HTTP_HOST=${BIND_ADDR%:*}
HTTP_HOST=${HTTP_HOST#[}; HTTP_HOST=${HTTP_HOST%]}
[[ -n $HTTP_HOST ]] || HTTP_HOST=0.0.0.0
port_free "$HTTP_HOST" "$HTTP_PORT" \
    || die "port $HTTP_PORT on $HTTP_HOST is already in use (another \`make run\`?); stop that, or run with PORT=<another port>"
case $HTTP_HOST in
    0.0.0.0 | ::) URL_HOST=127.0.0.1 ;;
    *:*) URL_HOST="[$HTTP_HOST]" ;;
    *) URL_HOST=$HTTP_HOST ;;
esac
BASE_URL="http://$URL_HOST:$HTTP_PORT"

if [[ -n ${WEBHOOK_SECRET:-} ]]; then
    SECRET_FROM_ENV=1
else
    SECRET_FROM_ENV=0
    export WEBHOOK_SECRET=$DEMO_SECRET
    log "WEBHOOK_SECRET is not set: using the DEMO secret '$DEMO_SECRET' (never use it in production)"
fi

# ---------------------------------------------------------------- servers
if [[ -n ${DATABASE_URL:-} && -n ${REDIS_URL:-} ]]; then
    EXTERNAL=1
    log "using DATABASE_URL and REDIS_URL from the environment (they are not stopped on exit)"
else
    EXTERNAL=0
    if [[ -n ${DATABASE_URL:-} || -n ${REDIS_URL:-} ]]; then
        log "only one of DATABASE_URL / REDIS_URL is set: ignoring it, starting private servers for both"
    fi
    command -v redis-server >/dev/null || die "redis-server not found (install redis, or set DATABASE_URL and REDIS_URL)"
    PG_BIN=$(find_pg_bin)
    mkdir -p "$RUN_DIR"

    # One `make run` at a time per checkout; anything else running from .run
    # is left over from a run that was killed without cleaning up.
    if [[ -f $RUN_DIR/run.pid ]]; then
        other=$(cat "$RUN_DIR/run.pid")
        if [[ $other != "$$" ]] && kill -0 "$other" 2>/dev/null \
            && ps -o args= -p "$other" 2>/dev/null | grep -q 'run\.sh'; then
            die "another make run (pid $other) is using $RUN_DIR; stop it first"
        fi
    fi
    echo $$ >"$RUN_DIR/run.pid"
    if [[ -f $RUN_DIR/redis.pid ]]; then
        old=$(cat "$RUN_DIR/redis.pid")
        if kill -0 "$old" 2>/dev/null && ps -o comm= -p "$old" 2>/dev/null | grep -q '^redis-server'; then
            log "stopping a redis-server left over from an earlier run (pid $old)"
            kill -TERM "$old" 2>/dev/null || true
        fi
        rm -f "$RUN_DIR/redis.pid"
    fi

    # PostgreSQL refuses to run as root: as root, the cluster belongs to (and
    # runs as) the postgres user.
    PG_DIR=$RUN_DIR/pg
    mkdir -p "$PG_DIR"
    chmod 700 "$PG_DIR"
    if [[ $(id -u) -eq 0 ]]; then
        id postgres >/dev/null 2>&1 || die "running as root, but there is no 'postgres' user to run PostgreSQL as"
        AS_PG=(runuser -u postgres --)
        chown postgres: "$PG_DIR"
        if ! as_pg test -w "$PG_DIR"; then
            # The checkout is under a folder the postgres user cannot
            # traverse (e.g. /root, mode 700): the cluster goes to a fresh
            # folder in /tmp instead, deleted on exit (so no fast restart).
            PG_DIR=$(mktemp -d /tmp/webhook-ledger-run-pg.XXXXXX)
            TMP_DIRS+=("$PG_DIR")
            chown postgres: "$PG_DIR"
            log "the postgres user cannot reach $RUN_DIR; the throwaway cluster is in $PG_DIR instead"
        fi
    fi
    PG_DATA_DIR=$PG_DIR/data
    # A Unix socket path is limited to ~107 bytes; a deep checkout gets /tmp.
    SOCK_DIR=$PG_DIR
    if (( ${#SOCK_DIR} > 80 )); then
        SOCK_DIR=$(mktemp -d /tmp/webhook-ledger-run-sock.XXXXXX)
        TMP_DIRS+=("$SOCK_DIR")
        ((${#AS_PG[@]} == 0)) || chown postgres: "$SOCK_DIR"
    fi

    if as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA_DIR" status >/dev/null 2>&1; then
        log "stopping a PostgreSQL left over from an earlier run"
        as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA_DIR" -m fast -w stop >/dev/null
    fi
    if [[ -f $PG_DATA_DIR/PG_VERSION ]]; then
        log "reusing the PostgreSQL cluster in $PG_DATA_DIR"
    else
        log "creating a PostgreSQL cluster in $PG_DATA_DIR"
        rm -rf "$PG_DATA_DIR"
        as_pg "$PG_BIN/initdb" -D "$PG_DATA_DIR" --auth=trust -U postgres -E UTF8 \
            --locale=C --no-sync >"$PG_DIR/initdb.log" 2>&1 \
            || { cat "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
    fi
    PG_PORT=$(free_port)
    PG_DATA=$PG_DATA_DIR
    log "starting PostgreSQL on 127.0.0.1:$PG_PORT"
    as_pg "$PG_BIN/pg_ctl" -D "$PG_DATA_DIR" -l "$PG_DIR/postgres.log" -w -t 30 \
        -o "-p $PG_PORT -c listen_addresses=127.0.0.1 -k '$SOCK_DIR'" start >/dev/null \
        || { tail -n 20 "$PG_DIR/postgres.log" >&2 || true; die "PostgreSQL did not start (log: $PG_DIR/postgres.log)"; }
    PG_ADMIN_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
    if [[ -z $(psql "$PG_ADMIN_URL" -XtAq -c "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'") ]]; then
        psql "$PG_ADMIN_URL" -Xq -v ON_ERROR_STOP=1 -c "CREATE DATABASE $DB_NAME" >/dev/null
    fi
    export DATABASE_URL="postgresql://postgres@127.0.0.1:$PG_PORT/$DB_NAME"

    REDIS_PORT=$(free_port)
    log "starting redis-server on 127.0.0.1:$REDIS_PORT"
    redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --save '' --appendonly no \
        --daemonize no --dir "$RUN_DIR" --pidfile "$RUN_DIR/redis.pid" \
        --logfile "$RUN_DIR/redis.log" --loglevel notice &
    REDIS_PID=$!
    wait_for "redis-server (log: $RUN_DIR/redis.log)" 10 redis_answers "$REDIS_PORT"
    export REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
fi

# ---------------------------------------------------------------- schema
log "applying schema.sql"
flask --app app init-db >/dev/null
psql "$DATABASE_URL" -Xq -v ON_ERROR_STOP=1 -c \
    "INSERT INTO user_balances (user_id, balance_cents) VALUES ('$DEMO_USER', 0) ON CONFLICT (user_id) DO NOTHING" \
    >/dev/null
# The first demo event id this database has not seen yet (evt_demo_1 on a
# fresh one), so that the pasted command answers "processed" once, then
# "duplicate", on every start, also with a reused cluster or external URLs.
DEMO_EVENT=evt_demo_$(psql "$DATABASE_URL" -XtAq -v ON_ERROR_STOP=1 -c \
    "SELECT coalesce(max(substring(event_id FROM '^evt_demo_([0-9]{1,9})\$')::int), 0) + 1
     FROM webhook_events WHERE event_id ~ '^evt_demo_[0-9]{1,9}\$'")
DEMO_BALANCE=$(psql "$DATABASE_URL" -XtAq -v ON_ERROR_STOP=1 -c \
    "SELECT balance_cents FROM user_balances WHERE user_id = '$DEMO_USER'")
log "demo user $DEMO_USER exists, balance $DEMO_BALANCE cents"

# ---------------------------------------------------------------- gunicorn
log "starting gunicorn on $BIND_ADDR"
gunicorn -c gunicorn.conf.py wsgi:app &
GUNICORN_PID=$!
wait_for "gunicorn ($BASE_URL/health)" 30 gunicorn_alive_and_healthy "$BASE_URL/health"

# What to paste into another terminal. Only the demo secret is printed; a
# real one is referenced from the pasting shell's environment.
if [[ $SECRET_FROM_ENV == 1 ]]; then
    HMAC_KEY='"${WEBHOOK_SECRET%%,*}"'
    KEY_NOTE="(signs with the first secret of \$WEBHOOK_SECRET: export it in that shell too)"
else
    HMAC_KEY="'$DEMO_SECRET'"
    KEY_NOTE="(signed with the DEMO secret '$DEMO_SECRET')"
fi
if [[ $EXTERNAL == 1 ]]; then
    PSQL_TARGET='"$DATABASE_URL"'
else
    PSQL_TARGET="'$DATABASE_URL'"
fi
cat <<EOF

======================================================================
webhook-ledger is up at $BASE_URL   (Ctrl-C stops it$([[ $EXTERNAL == 1 ]] || printf ' and its servers'))
$([[ $SECRET_FROM_ENV == 1 ]] || printf '\nWEBHOOK_SECRET = %s  <- a DEMO secret, for local use only\n' "$DEMO_SECRET")
Credit the demo user 1000 cents $KEY_NOTE; paste it twice:
the first answer is "processed", the second "duplicate".

BODY='{"id":"$DEMO_EVENT","type":"payment.succeeded","data":{"userId":"$DEMO_USER","amountCents":1000}}'
curl -sS -w 'HTTP %{http_code}\n' -X POST $BASE_URL/api/webhooks -H 'Content-Type: application/json' -H "X-Signature: \$(printf '%s' "\$BODY" | openssl dgst -sha256 -hmac $HMAC_KEY | sed 's/^.* //')" --data-binary "\$BODY"

The balance ($DEMO_BALANCE cents now, $((DEMO_BALANCE + 1000)) after that):

psql $PSQL_TARGET -c "SELECT user_id, balance_cents FROM user_balances WHERE user_id = '$DEMO_USER'"
======================================================================

EOF

# Foreground-ish: the traps run as soon as a signal arrives.
set +e
wait "$GUNICORN_PID"
status=$?
set -e
GUNICORN_PID=""
log "gunicorn exited with status $status"
exit "$status"
