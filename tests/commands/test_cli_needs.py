"""What each `flask` command reads of the settings (cli.needs): the read-only ones run with DATABASE_URL alone,
those that apply events stop in one line naming the setting they miss. Real `flask` processes, real PostgreSQL."""

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest

from app import create_app
from app.commands.base import Commands
from app.settings.config import Needs
from devservers import ROOT
from tests.helpers import BOB, UNKNOWN_USER, db_url, payment, send
from tests.providers.stripe.events import intent_succeeded, send_stripe

pytestmark = pytest.mark.core

EX_CONFIG = 78  # sysexits.h: a configuration error


def flask(env, *args):
    """Run `flask <args>` as the docs print it, in a shell that holds env alone but for what `. .run/env` sets
    beside the settings (the virtualenv's bin first on PATH, FLASK_APP=app); return the finished process."""
    shell = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "FLASK_APP": "app"}
    return subprocess.run(["flask", *args], cwd=ROOT, env={**shell, **env}, capture_output=True, text=True,
                          timeout=60)


READ_ONLY = [["events", "list"], ["events", "list", "--status", "failed"], ["events", "show", "evt_failed"],
             ["ledger", "verify"], ["events", "purge"]]


@pytest.mark.parametrize("command", READ_ONLY)
def test_read_only_commands_run_with_database_url_alone(client, db, command):
    send(client, payment("evt_failed", user=UNKNOWN_USER))
    done = flask({"DATABASE_URL": db_url(db)}, *command)
    assert done.returncode == 0, done
    assert done.stderr == ""


def test_a_balance_is_adjusted_with_database_url_alone(db):
    done = flask({"DATABASE_URL": db_url(db)}, "ledger", "adjust", str(BOB), "250", "--reason", "goodwill",
                 "--by", "ops")
    assert done.returncode == 0, done
    assert db.execute("SELECT balance_cents FROM user_balances WHERE user_id = %s", [BOB]).fetchone()[0] == 250


def test_a_bad_setting_with_a_default_still_stops_a_read_only_command(db):
    done = flask({"DATABASE_URL": db_url(db), "PG_POOL_SIZE": "0"}, "events", "list")
    assert done.returncode == EX_CONFIG
    assert done.stderr == "Error: configuration error: PG_POOL_SIZE must be >= 1, got 0\n"


def test_read_only_commands_do_not_read_the_secrets(db):
    """A short secret stops the service, not `events list`: it reads none."""
    done = flask({"DATABASE_URL": db_url(db), "WEBHOOK_SECRET": "short"}, "events", "list")
    assert (done.returncode, done.stdout) == (0, "no events\n"), done


@pytest.mark.parametrize("command, name, reads", [
    (["events", "replay", "evt_x"], "events replay", "the service's settings"),
    (["events", "replay", "--all-failed"], "events replay", "the service's settings"),
    (["init-db"], "init-db", "the service's settings"),
    (["reconcile", "default"], "reconcile", "the service's settings"),
    (["redis", "forget-done"], "redis forget-done", "DATABASE_URL and REDIS_URL"),
])
def test_a_command_that_needs_more_names_what_is_missing_in_one_line(db, command, name, reads):
    done = flask({"DATABASE_URL": db_url(db)}, *command)
    assert done.returncode == EX_CONFIG, done
    assert done.stderr == f"Error: configuration error: REDIS_URL is required but not set (flask {name} reads " \
                          f"{reads})\n"
    assert done.stdout == ""


@pytest.mark.parametrize("env, message", [
    ({"REDIS_URL": "redis://127.0.0.1:1/0"}, "WEBHOOK_SECRET is required but not set"),
    ({"REDIS_URL": "redis://127.0.0.1:1/0", "WEBHOOK_SECRET": "short"},
     "WEBHOOK_SECRET entry 0 (counted from 0) is shorter than 16 bytes"),
    ({"REDIS_URL": "redis://127.0.0.1:1/0", "WEBHOOK_SOURCES": "stripe"},
     "WEBHOOK_STRIPE_SECRET is required for source 'stripe' (named in WEBHOOK_SOURCES)"),
])
def test_a_replay_names_the_service_setting_it_misses(db, env, message):
    done = flask({"DATABASE_URL": db_url(db), **env}, "events", "replay", "--all-failed")
    assert done.returncode == EX_CONFIG, done
    assert done.stderr == f"Error: configuration error: {message} (flask events replay reads the service's settings)\n"


def test_nothing_runs_without_database_url():
    done = flask({}, "events", "list")
    assert (done.returncode, done.stderr) == (EX_CONFIG, "Error: configuration error: DATABASE_URL is required but "
                                                         "not set\n")


def _test_mode_payments(make_app, config):
    """Two Stripe test-mode payments the service accepts (STRIPE_ACCEPT_TEST_EVENTS); the operator's shell does not
    say so. Return the last."""
    service = make_app({**config, "STRIPE_ACCEPT_TEST_EVENTS": "true"}).test_client()
    for number in range(2):
        test_mode = intent_succeeded(f"pi_test_{number}", user=BOB, cents=300)
        test_mode["livemode"] = False
        assert send_stripe(service, test_mode).json["status"] == "processed"
    return test_mode


@pytest.mark.parametrize("scheme", ["stripe"])
def test_verify_judges_each_event_by_its_recorded_settings_not_the_shells(make_app, config, db):
    _test_mode_payments(make_app, config)
    verified = flask({"DATABASE_URL": db_url(db)}, "ledger", "verify")
    assert verified.returncode == 0, verified
    assert "INCONSISTENT" not in verified.stdout
    assert verified.stdout.splitlines()[-1] == (
        "ledger consistent: 2 users, 2 stored events, 2 payments, 2 journal rows; 2 events decided under other "
        "settings than this command's (LEDGER_CURRENCY=usd, STRIPE_ACCEPT_TEST_EVENTS=false), each judged by its own")


@pytest.mark.parametrize("scheme", ["stripe"])
def test_show_judges_an_event_by_its_recorded_settings_not_the_shells(make_app, config, db):
    test_mode = _test_mode_payments(make_app, config)
    shown = flask({"DATABASE_URL": db_url(db)}, "events", "show", test_mode.id)
    assert shown.returncode == 0, shown
    assert "movement:       credit of payment pi_test_1, 300 cents" in shown.stdout


def test_a_command_that_declares_nothing_needs_the_service(db):
    group = Commands("probe")

    @group.command("undeclared")
    def undeclared():
        click.echo("ran")

    @group.command("declared", needs=Needs.DATABASE)
    def declared():
        click.echo("ran")

    app = create_app({"DATABASE_URL": db_url(db)})
    app.cli.add_command(group)
    runner = app.test_cli_runner()
    assert runner.invoke(args=["probe", "declared"]).output == "ran\n"
    refused = runner.invoke(args=["probe", "undeclared"])
    assert refused.exit_code == EX_CONFIG
    assert refused.output == ("Error: configuration error: REDIS_URL is required but not set "
                              "(flask probe undeclared reads the service's settings)\n")
    app.extensions["db_pool"].close()
