"""Named sources (WEBHOOK_SOURCES) on POST /api/webhooks/<source>: an event is
(source, id); each source verifies with its own scheme, secrets and replay
window; an unknown source is 404 and writes nothing. Real PostgreSQL and Redis;
the exactly-once suite on a named source is in test_concurrency.py and
test_failures.py (EVERY_SCHEME_AND_A_NAMED_SOURCE)."""

import logging
import time

import pytest

from app.locking.lock import done_key
from app.settings.config import DEFAULT_SOURCE, Settings
from tests.helpers import (
    ALICE,
    BOB,
    SCHEMES,
    SECRETS,
    UNKNOWN_USER,
    assert_ledger_consistent,
    balance,
    encode,
    event_rows,
    payment,
    samples,
    secret_for,
    send,
    signed_headers,
    source_secret,
    sources_config,
)

pytestmark = pytest.mark.core

# One app: the default source (hmac-sha256, the config fixture's) and one
# named source per scheme, three of them taking their scheme from their name.
FOUR = {"billing": None, "stripe": None, "github": None, "svix": "standard-webhooks"}
SCHEME_OF = {DEFAULT_SOURCE: "hmac-sha256", "billing": "hmac-sha256", "stripe": "stripe", "github": "github",
             "svix": "standard-webhooks"}


def provider_payment(scheme, event_id, cents, user=ALICE):
    """A payment as the source's provider sends one: Stripe's payment_intent.succeeded, else the service's own
    shape (payment.succeeded)."""
    if scheme != "stripe":
        return payment(event_id, user=user, cents=cents)
    intent = {"id": f"pi_{event_id}", "object": "payment_intent", "amount_received": cents, "currency": "usd",
              "metadata": {"user_id": str(user)}}
    return {"id": event_id, "object": "event", "type": "payment_intent.succeeded", "livemode": True,
            "data": {"object": intent}}


def stored(db, event_id):
    """{source: status} of the rows stored under event_id."""
    return dict(db.execute("SELECT source, status FROM webhook_events WHERE event_id = %s", [event_id]).fetchall())


def credited(db, event_id):
    """{source: cents} of the ledger's credits for event_id."""
    return dict(db.execute("SELECT source, amount_cents FROM ledger_journal WHERE event_id = %s", [event_id]))


# -- each scheme on its own source, in one app -----------------------------------

@pytest.mark.parametrize("name", FOUR)
def test_each_scheme_verifies_on_its_own_named_source_in_one_app(make_app, config, db, redis_client, name):
    client = make_app(sources_config(config, FOUR)).test_client()
    assert Settings.of(client.application).sources[name].scheme == SCHEME_OF[name]
    event = provider_payment(SCHEME_OF[name], "evt_own_source", cents=40)
    first = send(client, event, source=name)
    assert (first.status, first.json) == (200, {"status": "processed", "event_id": "evt_own_source"})
    second = send(client, event, source=name)
    assert (second.status, second.json) == (200, {"status": "duplicate", "event_id": "evt_own_source"})
    assert balance(db) == 1040
    assert stored(db, "evt_own_source") == {name: "completed"}
    assert credited(db, "evt_own_source") == {name: 40}
    # The done marker is the source's: the same id elsewhere is another event.
    assert redis_client.exists(done_key("evt_own_source", name))
    assert not redis_client.exists(done_key("evt_own_source", DEFAULT_SOURCE))


def test_one_app_serves_the_default_and_every_named_source_at_once(make_app, config, db):
    client = make_app(sources_config(config, FOUR)).test_client()
    for cents, (name, scheme) in enumerate(SCHEME_OF.items(), start=1):
        event = provider_payment(scheme, "evt_everywhere", cents=cents)
        assert send(client, event, source=name).json["status"] == "processed", name
    for cents, (name, scheme) in enumerate(SCHEME_OF.items(), start=1):
        event = provider_payment(scheme, "evt_everywhere", cents=cents)
        assert send(client, event, source=name).json["status"] == "duplicate", name
    assert credited(db, "evt_everywhere") == {name: cents for cents, name in enumerate(SCHEME_OF, start=1)}
    assert balance(db) == 1000 + 1 + 2 + 3 + 4 + 5
    assert_ledger_consistent(db)


# -- an event is (source, id) ------------------------------------------------------

@pytest.mark.parametrize("first, second", [(DEFAULT_SOURCE, "billing"), ("billing", "stripe"), ("stripe", "svix")])
def test_same_id_on_two_sources_credits_twice(make_app, config, db, first, second):
    client = make_app(sources_config(config, FOUR)).test_client()
    for source, user in ((first, ALICE), (second, BOB)):
        event = provider_payment(SCHEME_OF[source], "evt_shared_id", cents=300, user=user)
        assert send(client, event, source=source).json == {"status": "processed", "event_id": "evt_shared_id"}
    assert (balance(db, ALICE), balance(db, BOB)) == (1300, 300)
    assert stored(db, "evt_shared_id") == {first: "completed", second: "completed"}
    assert credited(db, "evt_shared_id") == {first: 300, second: 300}
    assert_ledger_consistent(db)


def test_same_id_on_one_source_credits_once(make_app, config, db):
    client = make_app(sources_config(config, FOUR)).test_client()
    event = payment("evt_once", cents=300)
    answers = [send(client, event, source="billing").json["status"] for _ in range(3)]
    assert answers == ["processed", "duplicate", "duplicate"]
    # The same id with another effect on that source is a mismatch, not a second event.
    assert send(client, payment("evt_once", cents=301), source="billing").json["error"] == "payload_mismatch"
    assert balance(db) == 1300
    assert credited(db, "evt_once") == {"billing": 300}
    assert event_rows(db) == event_rows(db, "billing") == 1


def test_a_purged_event_is_recognised_by_its_own_sources_credit_only(make_app, config, db, redis_client):
    """ledger_journal outlives the row: it answers for its (source, id), not for the id on another source."""
    client = make_app(sources_config(config, FOUR)).test_client()
    event = payment("evt_purged", cents=10)
    assert send(client, event, source="billing").json["status"] == "processed"
    db.execute("DELETE FROM webhook_events")
    redis_client.flushall()  # so that PostgreSQL answers, not the done marker
    assert send(client, event, source="billing").json["status"] == "duplicate"
    assert send(client, event).json["status"] == "processed"  # the default source's evt_purged is new
    assert credited(db, "evt_purged") == {"billing": 10, DEFAULT_SOURCE: 10}
    assert balance(db) == 1020


# -- secrets are the source's own ------------------------------------------------

# Pairs of sources of one scheme: the signature is well formed where it is sent.
CROSS = {"billing": "hmac-sha256", "payouts": "hmac-sha256", "stripe": "stripe", "stripe-eu": "stripe",
         "svix": "standard-webhooks", "svix-eu": "standard-webhooks", "github": "github", "github-ent": "github"}


@pytest.mark.parametrize("signed_for, sent_to", [(DEFAULT_SOURCE, "billing"), ("billing", DEFAULT_SOURCE),
                                                 ("billing", "payouts"), ("stripe", "stripe-eu"),
                                                 ("svix", "svix-eu"), ("github-ent", "github")])
def test_a_secret_of_one_source_does_not_verify_on_another(make_app, config, db, redis_client, signed_for, sent_to):
    client = make_app(sources_config(config, CROSS)).test_client()
    scheme = CROSS.get(signed_for, "hmac-sha256")
    secret = SECRETS[scheme] if signed_for == DEFAULT_SOURCE else source_secret(signed_for, scheme)
    body = encode(payment("evt_cross", cents=500))
    headers = signed_headers(body, secret, scheme=scheme)
    response = send(client, body, headers, source=sent_to)
    assert (response.status, response.json["error"]) == (401, "invalid_signature")
    assert event_rows(db) == 0 and balance(db) == 1000
    assert redis_client.keys("*") == []
    # The same headers verify where they belong.
    assert send(client, body, headers, source=signed_for).json["status"] == "processed"


# -- a provider moved from one source to another --------------------------------

@pytest.mark.parametrize("redis_state", ["up", "flushed", "down"])
def test_a_provider_moved_to_a_named_source_is_not_credited_again(make_app, config, db, redis_client, redis_state):
    """WEBHOOK_<NAME>_MOVED_FROM: the new route's events are the old source's, so what the provider re-sends,
    on either route, is a duplicate; PostgreSQL decides, with Redis up, flushed or down."""
    secret = SECRETS["hmac-sha256"]  # the provider keeps its secret when it is moved
    before = make_app(config).test_client()
    sent_before = payment("evt_sent_before_the_move", cents=100)
    assert send(before, sent_before).json["status"] == "processed"

    moved = sources_config(config, {"stripe": "hmac-sha256"}, WEBHOOK_STRIPE_SECRET=secret,
                           WEBHOOK_STRIPE_MOVED_FROM=DEFAULT_SOURCE)
    if redis_state == "down":
        moved["REDIS_URL"] = "redis://127.0.0.1:1/0"
    after = make_app(moved).test_client()
    if redis_state == "flushed":
        redis_client.flushall()
    assert send(after, sent_before, secret=secret, source="stripe").json["status"] == "duplicate"
    sent_after = payment("evt_sent_after_the_move", cents=10)
    assert send(after, sent_after, secret=secret, source="stripe").json["status"] == "processed"
    for source in ("stripe", DEFAULT_SOURCE):  # both routes, while the old one is still served
        for event in (sent_before, sent_after):
            assert send(after, event, secret=secret, source=source).json["status"] == "duplicate"
    assert balance(db) == 1110
    assert (event_rows(db, DEFAULT_SOURCE), event_rows(db, "stripe")) == (2, 0)
    assert_ledger_consistent(db)


def _rotating_and_steady(make_app, config, scheme):
    """A client serving "rotating" (a new and an old secret) and "steady" (its own), and the (new, old,
    retired) secrets; _ROTATION sends each of them to each source."""
    new, old, retired = (secret_for(scheme, f"{name}-secret-0123456789") for name in ("new", "old", "retired"))
    app_config = sources_config(config, {"rotating": scheme, "steady": scheme},
                                WEBHOOK_ROTATING_SECRET=f"{new},{old}",
                                WEBHOOK_STEADY_SECRET=source_secret("steady", scheme))
    return make_app(app_config).test_client(), {"old": old, "new": new, "retired": retired, "steady's own": None}


# (source, secret, status): the rotating source's secrets are its own, neither verifies on the other source.
_ROTATION = [("rotating", "old", 200), ("rotating", "new", 200), ("rotating", "retired", 401),
             ("steady", "old", 401), ("steady", "new", 401), ("steady", "steady's own", 200)]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rotation_is_per_source(make_app, config, db, scheme):
    client, secrets = _rotating_and_steady(make_app, config, scheme)
    answers = [(source, name, send(client, payment(), secret=secrets[name], source=source).status)
               for source, name, _ in _ROTATION]
    assert answers == _ROTATION
    assert balance(db) == 1000 + 3 * 250


@pytest.mark.parametrize("scheme", SCHEMES)
def test_the_delivery_line_names_each_sources_secret_by_its_index(make_app, config, db, scheme, caplog):
    client, secrets = _rotating_and_steady(make_app, config, scheme)
    with caplog.at_level(logging.INFO, logger="app.receiver.webhooks"):
        for source, name, _ in _ROTATION:
            send(client, payment(), secret=secrets[name], source=source)
    lines = [(r.source, r.secret_index, r.status) for r in caplog.records if r.getMessage() == "delivery"]
    assert lines == [("rotating", 1, 200), ("rotating", 0, 200), ("rotating", None, 401),
                     ("steady", None, 401), ("steady", None, 401), ("steady", 0, 200)]


def test_a_stripe_delivery_to_an_hmac_sha256_source_is_told_the_sources_scheme(make_app, config, db):
    client = make_app(sources_config(config, FOUR)).test_client()
    body = encode(provider_payment("stripe", "evt_wrong_scheme", 100))
    response = send(client, body, source="billing", scheme="stripe", secret=source_secret("stripe", "stripe"))
    assert (response.status, response.json["error"]) == (401, "invalid_signature")
    assert response.json["message"] == ("missing X-Signature header: this source verifies the hmac-sha256 scheme, "
                                        "and the request carries Stripe-Signature, the stripe scheme's header")
    assert event_rows(db) == 0


# -- unknown sources ----------------------------------------------------------------

UNKNOWN_NAMES = pytest.mark.parametrize("name", ["nope", "Billing", "billing-", "x" * 65, "default", "None",
                                                  "%E2%82%AC"])


def _send_to_unknown(make_app, config, name):
    """A payment sent to /api/webhooks/<name>, signed with the billing secret and with the default one (neither is
    looked at): the two answers."""
    client = make_app(sources_config(config, {"billing": None})).test_client()
    return [send(client, encode(payment("evt_unknown")), secret=secret, path=f"/api/webhooks/{name}")
            for secret in (source_secret("billing", "hmac-sha256"), SECRETS["hmac-sha256"])]


@UNKNOWN_NAMES
def test_an_unknown_source_is_404_unknown_source(make_app, config, db, name):
    for response in _send_to_unknown(make_app, config, name):
        assert response.status == 404
        assert response.json == {"error": "unknown_source"}
        assert response.headers["X-Request-ID"]


@UNKNOWN_NAMES
def test_an_unknown_source_writes_nothing(make_app, config, db, redis_client, name):
    _send_to_unknown(make_app, config, name)
    assert event_rows(db) == 0 and balance(db) == 1000
    assert redis_client.keys("*") == []


def test_unknown_source_is_refused_before_the_body_is_read(make_app, config, db):
    """Nothing about the request is looked at: no Content-Type, signature or size check."""
    client = make_app({**config, "MAX_BODY_BYTES": 10}).test_client()
    response = send(client, b"x" * 100, {"Content-Type": "text/plain"}, source="nope")
    assert (response.status, response.json) == (404, {"error": "unknown_source"})


def test_default_path_is_404_when_only_named_sources_are_configured(make_app, config, db, redis_client):
    client = make_app(sources_config(config, {"billing": None}, WEBHOOK_SECRET=None)).test_client()
    assert DEFAULT_SOURCE not in Settings.of(client.application).sources
    event = payment("evt_sources_only")
    response = send(client, event)  # signed with the would-be default secret
    assert (response.status, response.json) == (404, {"error": "unknown_source"})
    assert event_rows(db) == 0 and redis_client.keys("*") == []
    assert send(client, event, source="billing").json["status"] == "processed"


# -- the scheme and the window of a source -------------------------------------------

@pytest.mark.parametrize("name, scheme", [("stripe", "stripe"), ("github", "github"),
                                          ("standard-webhooks", "standard-webhooks"), ("hmac-sha256", "hmac-sha256"),
                                          ("billing", "hmac-sha256"), ("stripe-eu", "hmac-sha256")])
def test_scheme_defaults_to_the_name_when_it_is_a_scheme_else_hmac_sha256(make_app, config, db, name, scheme):
    client = make_app(sources_config(config, {name: None})).test_client()
    assert Settings.of(client.application).sources[name].scheme == scheme
    body = encode(payment("evt_default_scheme"))
    headers = signed_headers(body, source_secret(name, scheme), scheme=scheme)
    assert send(client, body, headers, source=name).json["status"] == "processed"
    if scheme != "hmac-sha256":  # the same secret under the default scheme's header is refused
        headers = signed_headers(body, source_secret(name, scheme), scheme="hmac-sha256")
        assert send(client, body, headers, source=name).status == 401


def test_scheme_is_the_sources_own_setting_when_given(make_app, config, db):
    client = make_app(sources_config(config, {"stripe": "hmac-sha256"})).test_client()
    body = encode(payment("evt_explicit"))
    stripe_headers = signed_headers(body, source_secret("stripe", "hmac-sha256"), scheme="stripe")
    assert send(client, body, stripe_headers, source="stripe").status == 401
    headers = signed_headers(body, source_secret("stripe", "hmac-sha256"))
    assert send(client, body, headers, source="stripe").json["status"] == "processed"


WINDOWED = pytest.mark.parametrize("scheme", ["stripe", "standard-webhooks"])


def _windowed(make_app, config, scheme):
    """A client of two sources of scheme: strict, with a window of 60 s of its own, and lenient, with none (the
    deployment's is 600 s)."""
    app_config = sources_config(config, {"strict": scheme, "lenient": scheme}, WEBHOOK_TOLERANCE_SECONDS=600,
                                WEBHOOK_STRICT_TOLERANCE_SECONDS=60)
    return make_app(app_config).test_client()


@WINDOWED
def test_tolerance_is_per_source(make_app, config, db, scheme):
    """Signed 200 s ago: outside strict's 60 s window, inside lenient's."""
    client = _windowed(make_app, config, scheme)
    assert Settings.of(client.application).sources["strict"].tolerance == 60
    body = encode(payment("evt_window"))
    signed_at = int(time.time()) - 200
    for name, status in (("strict", 401), ("lenient", 200)):
        headers = signed_headers(body, source_secret(name, scheme), scheme=scheme, timestamp=signed_at)
        assert send(client, body, headers, source=name).status == status, name
    assert event_rows(db) == event_rows(db, "lenient") == 1


@WINDOWED
def test_a_sources_tolerance_defaults_to_the_deployments(make_app, config, db, scheme):
    sources = Settings.of(_windowed(make_app, config, scheme).application).sources
    assert (sources["lenient"].tolerance, sources[DEFAULT_SOURCE].tolerance) == (600, 600)


# -- metrics, logs --------------------------------------------------------------------

def _scraped_after_deliveries(make_app, config):
    """/metrics' text and samples after deliveries to three sources (one refused) and to three unknown ones."""
    client = make_app(sources_config(config, FOUR)).test_client()
    send(client, payment("evt_m"))
    send(client, payment("evt_m"), source="billing")
    send(client, payment("evt_m"), source="billing")
    send(client, payment("evt_m"), source="stripe", secret="wrong")
    for unknown in ("attacker-chosen-1", "attacker-chosen-2", "default"):
        body = encode(payment())
        assert send(client, body, path=f"/api/webhooks/{unknown}").status == 404
    text = client.get("/metrics").text
    return text, samples(text)


def test_metrics_label_each_delivery_with_its_configured_source(make_app, config, db):
    _, scraped = _scraped_after_deliveries(make_app, config)
    deliveries = {labels: value for (name, labels), value in scraped.items()
                  if name == "webhook_ledger_deliveries_total"}
    assert deliveries == {
        (("outcome", "processed"), ("reason", ""), ("source", DEFAULT_SOURCE)): 1,
        (("outcome", "processed"), ("reason", ""), ("source", "billing")): 1,
        (("outcome", "duplicate"), ("reason", ""), ("source", "billing")): 1,
        (("outcome", "rejected"), ("reason", "invalid_signature"), ("source", "stripe")): 1,
    }


def test_metrics_count_unknown_sources_without_a_label(make_app, config, db):
    text, scraped = _scraped_after_deliveries(make_app, config)
    assert scraped[("webhook_ledger_unknown_source_requests_total", ())] == 3
    labelled = {dict(labels).get("source") for _, labels in scraped}
    assert labelled <= {None, *SCHEME_OF}
    assert "attacker-chosen" not in text


def test_the_delivery_log_line_names_the_source(make_app, config, db, caplog):
    client = make_app(sources_config(config, FOUR)).test_client()
    with caplog.at_level(logging.INFO, logger="app.receiver.webhooks"):
        send(client, payment("evt_logged"), source="svix")
        send(client, payment("evt_logged"))
        send(client, payment(), source="attacker-chosen")
    lines = [(r.source, r.event_id, r.outcome, r.status) for r in caplog.records if r.getMessage() == "delivery"]
    # An unknown source is logged without a source: a name from the request is never a field's value.
    assert lines == [("svix", "evt_logged", "processed", 200), (DEFAULT_SOURCE, "evt_logged", "processed", 200),
                     (None, None, "rejected", 404)]
    assert "attacker-chosen" not in caplog.text


# -- the CLI on two sources with the same id --------------------------------------------

def _two_sources(make_app, config):
    """billing's evt_same failed (unknown user) and evt_only; the default source's evt_same completed.

    Returns a runner of `flask` commands on that app.
    """
    app = make_app(sources_config(config, {"billing": None}))
    client = app.test_client()
    assert send(client, payment("evt_same", user=UNKNOWN_USER, cents=70), source="billing").status == 422
    assert send(client, payment("evt_only", cents=1), source="billing").status == 200
    assert send(client, payment("evt_same", cents=30)).status == 200
    runner = app.test_cli_runner()
    return lambda *args: runner.invoke(args=list(args))


def _listed(result):
    assert result.exit_code == 0, result.output
    return [tuple(line.split()[:2]) for line in result.output.splitlines()[1:]]


def test_cli_list_filters_by_source(make_app, config, db):
    run = _two_sources(make_app, config)
    assert _listed(run("events", "list")) == [("default", "evt_same"), ("billing", "evt_only"),
                                              ("billing", "evt_same")]
    assert _listed(run("events", "list", "--source", "billing")) == [("billing", "evt_only"), ("billing", "evt_same")]
    assert _listed(run("events", "list", "--source", "default")) == [("default", "evt_same")]
    assert run("events", "list", "--source", "nope").output == "no events\n"


def test_cli_show_reads_the_named_sources_event(make_app, config, db):
    run = _two_sources(make_app, config)
    default = run("events", "show", "evt_same")
    assert default.exit_code == 0, default.output
    assert "source:         default" in default.output and "status:         completed" in default.output
    assert "balance change: credit of payment pay_evt_same: +30 cents to " + str(ALICE) in default.output
    billing = run("events", "show", "evt_same", "--source", "billing")
    assert billing.exit_code == 0, billing.output
    assert "source:         billing" in billing.output and "status:         failed" in billing.output
    assert '"amountCents": 70' in billing.output and "balance change: -" in billing.output
    missing = run("events", "show", "evt_only")
    assert missing.exit_code == 1 and "no stored event 'evt_only' of source 'default'" in missing.output


def test_cli_show_of_an_event_stored_under_another_source_names_that_source(make_app, config, db):
    run = _two_sources(make_app, config)
    missing = run("events", "show", "evt_only")
    assert missing.exit_code == 1
    assert "no stored event 'evt_only' of source 'default'; it is stored under --source billing" in missing.output
    nowhere = run("events", "show", "evt_nowhere")
    assert nowhere.exit_code == 1 and "stored under" not in nowhere.output


def test_cli_replay_applies_the_named_sources_event_only(make_app, config, db):
    run = _two_sources(make_app, config)
    db.execute("INSERT INTO user_balances (user_id, balance_cents) VALUES (%s, 0)", [UNKNOWN_USER])
    # The default source's evt_same is completed: replaying it changes nothing.
    result = run("events", "replay", "evt_same")
    assert (result.exit_code, result.output) == (0, "evt_same: already completed; nothing changed\n")
    assert balance(db, UNKNOWN_USER) == 0
    result = run("events", "replay", "evt_same", "--source", "billing")
    assert (result.exit_code, result.output) == (0, "billing/evt_same: processed; now completed\n")
    assert balance(db, UNKNOWN_USER) == 70 and balance(db) == 1031
    assert credited(db, "evt_same") == {"billing": 70, DEFAULT_SOURCE: 30}
    assert run("events", "replay", "evt_only", "--source", "nope").output == "nope/evt_only: no such stored event\n"
    assert run("ledger", "verify").exit_code == 0


def test_cli_purge_deletes_the_named_sources_events_only(make_app, config, db):
    run = _two_sources(make_app, config)
    db.execute("UPDATE webhook_events SET created_at = now() - interval '40 days'")
    result = run("events", "purge", "--source", "billing")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("purged 1 completed events")  # billing's failed evt_same is kept
    assert sorted(db.execute("SELECT source, event_id FROM webhook_events").fetchall()) == \
        [("billing", "evt_same"), ("default", "evt_same")]
    assert run("events", "purge").output.startswith("purged 1 completed events")
    assert db.execute("SELECT source, event_id FROM webhook_events").fetchall() == [("billing", "evt_same")]
    assert db.execute("SELECT count(*) FROM ledger_journal").fetchone()[0] == 2
    assert run("ledger", "verify").exit_code == 0

