"""A razorpay source that fetches (WEBHOOK_RAZORPAY_FETCH=true, app/providers/razorpay/): the payment, refund or
dispute an event moves money by is fetched from Razorpay's API with its official client (razorpay.Client, here
talking to devservers/razorpay_stand_in.py over HTTP) and the money read from Razorpay's copy. Real PostgreSQL and
Redis."""

import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import razorpay

from app.settings import config as app_config
from devservers import ROOT
from devservers.razorpay_stand_in import RazorpayStandIn
from tests.helpers import (
    BOB,
    assert_ledger_consistent,
    balance,
    db_url,
    drain,
    encode,
    event_rows,
    record_currency,
    samples,
    send,
    sources_config,
    waiting_row,
    waiting_rows,
)
from tests.providers.razorpay.events import dispute_event, new_id, payment_captured, payment_entity, refund_event
from tests.providers.razorpay.test_delivery import INR, SOURCE, razorpay_event_id, razorpay_headers, send_razorpay

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def razorpay_api_server():
    stand_in = RazorpayStandIn().start()
    yield stand_in
    stand_in.close()


@pytest.fixture
def razorpay_api(razorpay_api_server):
    """Razorpay's API on loopback, holding no entity and failing nothing: this test's alone."""
    razorpay_api_server.reset()
    return razorpay_api_server


@pytest.fixture
def config(db, redis_server, redis_client, razorpay_api):
    """Razorpay on its own route, fetching from the stand-in; the ledger in rupees."""
    base = {"DATABASE_URL": db_url(db), "REDIS_URL": redis_server.url}
    record_currency(db, "inr")
    return sources_config(base, {SOURCE: None}, LEDGER_CURRENCY="inr", WEBHOOK_RAZORPAY_FETCH="true",
                          WEBHOOK_RAZORPAY_API_KEY=razorpay_api.api_key, WEBHOOK_RAZORPAY_API_BASE=razorpay_api.url)


def _entities(event):
    """The entity a Razorpay event's money is read from (the refund of a refund event, not its payment), as
    Razorpay's API returns it: a list, to add."""
    return [next(event["payload"][name]["entity"] for name in ("refund", "dispute", "payment")
                 if name in event["payload"])]


def _journal(db):
    return db.execute("SELECT kind, movement_id, amount_cents FROM ledger_journal ORDER BY id").fetchall()


def _contradictions(client):
    return samples(client.get("/metrics").text).get(
        ("webhook_ledger_provider_contradictions_total", (("source", SOURCE),)), 0)


# -- the stand-in, as Razorpay's own client reads it -------------------------------------------------

def test_razorpays_own_client_fetches_a_payment_a_refund_and_a_dispute_from_the_stand_in(razorpay_api):
    payment_id, refund_id, dispute_id = new_id("pay"), new_id("rfnd"), new_id("disp")
    razorpay_api.add(payment_entity(payment_id),
                     *_entities(refund_event("refund.processed", refund_id, payment_id, 300, "processed")),
                     *_entities(dispute_event("payment.dispute.lost", dispute_id, payment_id, 200, "lost")))
    client = razorpay.Client(auth=tuple(razorpay_api.api_key.split(":")), base_url=razorpay_api.url)
    assert client.payment.fetch(payment_id)["id"] == payment_id
    assert client.refund.fetch(refund_id)["amount"] == 300
    assert client.dispute.fetch(dispute_id)["status"] == "lost"
    assert razorpay_api.paths == [f"/v1/payments/{payment_id}", f"/v1/refunds/{refund_id}",
                                     f"/v1/disputes/{dispute_id}"]
    with pytest.raises(razorpay.errors.BadRequestError, match="The id provided does not exist"):
        client.payment.fetch(new_id("pay"))
    wrong = razorpay.Client(auth=("rzp_test_other", "secret"), base_url=razorpay_api.url)
    with pytest.raises(razorpay.errors.BadRequestError, match="The API key provided is invalid"):
        wrong.payment.fetch(payment_id)


# -- each movement, fetched ----------------------------------------------------------------------

def _movements(payment_id, refund_id, failed_id, dispute_id):
    """A payment of 1000 rupees to Bob, a refund, a refund that failed, a dispute lost then won: as delivered."""
    return [payment_captured(payment_id, user=BOB, paise=100000),
            refund_event("refund.processed", refund_id, payment_id, 10000, "processed"),
            refund_event("refund.created", failed_id, payment_id, 5000, "pending"),
            refund_event("refund.failed", failed_id, payment_id, 5000, "failed"),
            dispute_event("payment.dispute.lost", dispute_id, payment_id, 20000, "lost", deducted=20000),
            dispute_event("payment.dispute.won", dispute_id, payment_id, 20000, "won", deducted=20000)]


def test_each_razorpay_movement_is_fetched_and_applied_once(client, db, razorpay_api):
    payment_id, refund_id, failed_id, dispute_id = new_id("pay"), new_id("rfnd"), new_id("rfnd"), new_id("disp")
    events = _movements(payment_id, refund_id, failed_id, dispute_id)
    # Razorpay's records now: the payment, the refund processed, the other failed, the dispute won.
    razorpay_api.add(*_entities(events[0]), *_entities(events[1]), *_entities(events[3]), *_entities(events[5]))
    headers = [new_id("evt")[4:] for _ in events]
    for event, header_id in zip(events, headers, strict=True):
        assert send_razorpay(client, event, header_id).status == 200
        assert send_razorpay(client, event, header_id).json["status"] == "duplicate"
    # Each first delivery asks; its duplicate asks nothing (the done marker, or the row, answers it).
    assert razorpay_api.count("/v1/payments/") == 1
    assert razorpay_api.count("/v1/refunds/") == 3 and razorpay_api.count("/v1/disputes/") == 2
    # 1000 - 100 (refund); the refund created is read failed (Razorpay's record now): it takes nothing; the
    # dispute's lost and won are both read won (Razorpay's record now): it takes nothing either.
    assert balance(db, BOB) == 90000
    assert [row for row in _journal(db) if row[0] != "credit"] == [("refund", refund_id, -10000)]
    assert_ledger_consistent(db, INR)


def test_what_a_lost_dispute_withdraws_is_what_razorpays_record_says_it_deducted(client, db, razorpay_api):
    """The delivered entity says 200 rupees deducted; Razorpay's record of the dispute, 150: the record decides."""
    payment_id, dispute_id = new_id("pay"), new_id("disp")
    paid = payment_captured(payment_id, user=BOB, paise=100000)
    record = dispute_event("payment.dispute.lost", dispute_id, payment_id, 20000, "lost", deducted=15000)
    razorpay_api.add(*_entities(paid), *_entities(record))
    assert send_razorpay(client, paid).status == 200
    delivered = dispute_event("payment.dispute.lost", dispute_id, payment_id, 20000, "lost", deducted=20000)
    assert send_razorpay(client, delivered).json["status"] == "processed"
    assert balance(db, BOB) == 85000
    assert [row for row in _journal(db) if row[0] != "credit"] == [("dispute_withdrawn", dispute_id, -15000)]
    assert_ledger_consistent(db, INR)


@pytest.mark.parametrize("won_first", [False, True], ids=["won-after-lost", "won-before-lost"])
def test_a_late_won_of_a_dispute_lost_in_pre_arbitration_does_what_razorpays_record_says(
        client, db, razorpay_api, won_first):
    """Won in the chargeback phase (nothing deducted), then lost in pre-arbitration (150 rupees deducted): Razorpay's
    record says lost. The won's delivery comes late, before or after the loss's: read from the record, it is a loss
    of 150 too, and the dispute withdraws 150 once; it never gives back what the loss took."""
    payment_id, dispute_id = new_id("pay"), new_id("disp")
    paid = payment_captured(payment_id, user=BOB, paise=100000)
    won = dispute_event("payment.dispute.won", dispute_id, payment_id, 20000, "won")
    lost = dispute_event("payment.dispute.lost", dispute_id, payment_id, 20000, "lost", deducted=15000)
    lost["payload"]["dispute"]["entity"]["phase"] = "pre_arbitration"
    razorpay_api.add(*_entities(paid), *_entities(lost))  # the record now: lost, in pre-arbitration
    assert send_razorpay(client, paid).status == 200
    for event in ([won, lost] if won_first else [lost, won]):
        assert send_razorpay(client, event).json["status"] == "processed"
    assert balance(db, BOB) == 85000
    assert [row for row in _journal(db) if row[0] != "credit"] == [("dispute_withdrawn", dispute_id, -15000)]
    assert_ledger_consistent(db, INR)
    # docs/providers/razorpay.md's query lists the won read from the lost record, for a person to check what it did
    # before.
    page = (ROOT / "docs" / "providers" / "razorpay.md").read_text().partition("## Limits")[2]
    query = re.search(r"```sql\n(.*?)```", page, re.S).group(1)
    assert [(row[2], row[3]) for row in db.execute(query).fetchall()] == [("payment.dispute.won", "lost")]


def test_a_dispute_razorpay_has_not_decided_moves_nothing_whatever_its_event(client, db, razorpay_api):
    """A won delivered while Razorpay's record has the dispute open again (pre-arbitration after the win): the record
    has no outcome, so nothing moves; the outcome's own event moves the money when it comes."""
    payment_id, dispute_id = new_id("pay"), new_id("disp")
    paid = payment_captured(payment_id, user=BOB, paise=100000)
    reopened = dispute_event("payment.dispute.created", dispute_id, payment_id, 20000, "open")
    razorpay_api.add(*_entities(paid), *_entities(reopened))
    assert send_razorpay(client, paid).status == 200
    won = dispute_event("payment.dispute.won", dispute_id, payment_id, 20000, "won")
    assert send_razorpay(client, won).json["status"] == "processed"
    razorpay_api.add(*_entities(dispute_event("payment.dispute.lost", dispute_id, payment_id, 20000, "lost")))
    lost = dispute_event("payment.dispute.lost", dispute_id, payment_id, 20000, "lost")
    assert send_razorpay(client, lost).json["status"] == "processed"
    assert [row for row in _journal(db) if row[0] != "credit"] == [("dispute_withdrawn", dispute_id, -20000)]
    assert_ledger_consistent(db, INR)


def test_a_dispute_whose_record_names_no_status_razorpay_sends_is_422(client, db, razorpay_api):
    payment_id, dispute_id = new_id("pay"), new_id("disp")
    paid = payment_captured(payment_id, user=BOB, paise=100000)
    record = dispute_event("payment.dispute.lost", dispute_id, payment_id, 20000, "settled")
    razorpay_api.add(*_entities(paid), *_entities(record))
    assert send_razorpay(client, paid).status == 200
    answer = send_razorpay(client, dispute_event("payment.dispute.lost", dispute_id, payment_id, 20000, "lost"))
    assert answer.status == 422
    assert answer.json["message"] == ("payload.dispute.entity.status must be one of open, under_review, won, lost, "
                                      "closed (Razorpay's record of the dispute)")
    assert balance(db, BOB) == 100000


def test_an_event_that_moves_no_money_asks_razorpay_nothing(client, db, razorpay_api):
    event = dispute_event("payment.dispute.created", new_id("disp"), new_id("pay"), 4000, "open")
    assert send_razorpay(client, event).json["status"] == "processed"
    assert razorpay_api.paths == []


def test_a_source_that_does_not_fetch_asks_razorpay_nothing(make_app, config, db, razorpay_api):
    client = make_app({**config, "WEBHOOK_RAZORPAY_FETCH": "false"}).test_client()
    assert send_razorpay(client, payment_captured(new_id("pay"), user=BOB, paise=400)).json["status"] == "processed"
    assert razorpay_api.paths == []
    assert balance(db, BOB) == 400


def test_the_money_is_read_from_razorpays_payment_and_both_bytes_are_kept(client, db, app, razorpay_api):
    """A notification whose amount Razorpay's record contradicts: the record decides, the contradiction is counted,
    and the row keeps the delivered bytes and Razorpay's beside them, which replay, verify and show read."""
    payment_id, header_id = new_id("pay"), "HQ9tqtn9mNxM5C"
    razorpay_api.add(payment_entity(payment_id, user=BOB, paise=1200))
    delivered = encode(payment_captured(payment_id, user=BOB, paise=99_000))
    assert send(client, delivered, razorpay_headers(delivered, header_id), source=SOURCE).status == 200
    assert balance(db, BOB) == 1200
    assert _contradictions(client) == 1
    event_id = razorpay_event_id(header_id, delivered)
    body, fetched = db.execute("SELECT body, fetched FROM webhook_events WHERE event_id = %s", [event_id]).fetchone()
    assert bytes(body) == delivered and b'"amount": 1200' in bytes(fetched) and b'"entity": "payment"' in fetched
    verified = app.test_cli_runner().invoke(args=["ledger", "verify"])
    assert verified.exit_code == 0, verified.output
    shown = app.test_cli_runner().invoke(args=["events", "show", "--source", SOURCE, event_id]).output
    assert "1200" in shown.split("\nfetched (")[1] and "99000" in shown.split("\nfetched (")[0]
    assert_ledger_consistent(db, INR)


def test_a_refund_read_from_razorpays_record_takes_its_amount(client, db, razorpay_api):
    payment_id, refund_id = new_id("pay"), new_id("rfnd")
    paid = payment_captured(payment_id, user=BOB, paise=10000)
    razorpay_api.add(*_entities(paid))
    assert send_razorpay(client, paid).json["status"] == "processed"
    razorpay_api.add(*_entities(refund_event("refund.processed", refund_id, payment_id, 2500, "processed")))
    assert send_razorpay(client, refund_event("refund.processed", refund_id, payment_id, 9000, "processed")).status \
        == 200
    assert balance(db, BOB) == 7500
    assert _contradictions(client) == 1


def test_an_old_body_sent_under_a_coming_events_header_cannot_block_it_when_fetching(client, db, razorpay_api):
    """Issue 35's id squatting, with the fetch on: an old signed body first under the header of a refund not
    delivered yet is another event (its own digest); the refund, when it comes, is fetched and debits once."""
    payment_id, refund_id, header_id = new_id("pay"), new_id("rfnd"), "HQ9tqtn9mNxM5C"
    paid = payment_captured(payment_id, user=BOB, paise=10000)
    genuine = refund_event("refund.processed", refund_id, payment_id, 4000, "processed")
    razorpay_api.add(*_entities(paid), *_entities(genuine))
    assert send_razorpay(client, paid).json["status"] == "processed"
    assert send_razorpay(client, paid, header_id).json["status"] == "duplicate"  # the squatter's
    answer = send_razorpay(client, genuine, header_id)
    assert answer.json == {"status": "processed", "event_id": razorpay_event_id(header_id, encode(genuine))}
    assert send_razorpay(client, genuine, header_id).json["status"] == "duplicate"  # Razorpay's retry
    assert balance(db, BOB) == 6000
    assert [row for row in _journal(db) if row[0] != "credit"] == [("refund", refund_id, -4000)]
    assert_ledger_consistent(db, INR)


# -- Razorpay's API failing ----------------------------------------------------------------------

def test_an_entity_razorpay_does_not_have_is_422_kept_without_its_body_and_its_retry_applies(client, db, app,
                                                                                           razorpay_api):
    event = payment_captured(new_id("pay"), user=BOB, paise=800)
    header_id = new_id("evt")[4:]
    response = send_razorpay(client, event, header_id)
    assert (response.status, response.json["error"]) == (422, "unprocessable")
    payment_id = event["payload"]["payment"]["entity"]["id"]
    assert f"Razorpay's API has no payment {payment_id}" in response.json["message"]
    event_id = razorpay_event_id(header_id, encode(event))
    kept = waiting_row(db, event_id)
    assert (kept.state, kept.body) == ("unknown", None) and event_rows(db) == 0
    razorpay_api.add(*_entities(event))  # Razorpay has it now
    assert send_razorpay(client, event, header_id).json["status"] == "processed"
    assert send_razorpay(client, event, header_id).json["status"] == "duplicate"
    assert balance(db, BOB) == 800 and waiting_row(db, event_id) is None
    assert_ledger_consistent(db, INR)


@pytest.mark.parametrize("status", [404, 400])
def test_a_404_or_400_is_razorpay_having_no_such_entity(client, db, razorpay_api, status):
    event = payment_captured(new_id("pay"), user=BOB, paise=800)
    razorpay_api.add(*_entities(event))
    razorpay_api.fail_next(status)
    assert send_razorpay(client, event).status == 422
    assert balance(db, BOB) == 0


@pytest.mark.parametrize("status", [429, 500])
def test_razorpays_api_failing_is_accepted_and_the_drain_applies_it_once(app, client, db, razorpay_api, status):
    event, header_id = payment_captured(new_id("pay"), user=BOB, paise=500), new_id("evt")[4:]
    razorpay_api.add(*_entities(event))
    razorpay_api.fail_next(status)
    response = send_razorpay(client, event, header_id)
    assert (response.status, response.json["status"]) == (202, "accepted")
    assert event_rows(db) == 0 and waiting_rows(db) == 1
    assert drain(app, db) == 1
    assert send_razorpay(client, event, header_id).json["status"] == "duplicate"
    assert balance(db, BOB) == 500
    assert_ledger_consistent(db, INR)


@pytest.mark.parametrize("fault", ["drip", "hang"])
def test_a_razorpay_api_that_drips_or_hangs_is_accepted_within_the_deadline(make_app, config, db, razorpay_api, fault):
    client = make_app({**config, "PROVIDER_DEADLINE_MS": "500"}).test_client()
    event = payment_captured(new_id("pay"), user=BOB, paise=500)
    razorpay_api.add(*_entities(event))
    if fault == "drip":
        razorpay_api.drip = 0.1  # a byte every tenth of a second: each read is quick, the answer never ends
    else:
        razorpay_api.hang = True
    started = time.monotonic()
    response = send_razorpay(client, event)
    took = time.monotonic() - started
    assert (response.status, response.json["status"]) == (202, "accepted")
    assert took < 1.5, took  # the deadline (0.5 s) and the rest of the delivery, not the provider's pace
    assert event_rows(db) == 0 and waiting_rows(db) == 1


def test_our_credentials_refused_is_accepted_one_line_and_a_count(client, db, razorpay_api, caplog):
    event = payment_captured(new_id("pay"), user=BOB, paise=500)
    razorpay_api.add(*_entities(event))
    razorpay_api.credentials = "rzp_test_rotated:anotherSecret0123"  # the key no longer Razorpay's
    response = send_razorpay(client, event)
    # Recorded, so nothing is lost while the key is fixed; the sender is not told of our configuration.
    assert (response.status, set(response.json)) == (202, {"status", "event_id"})
    assert event_rows(db) == 0 and waiting_rows(db) == 1
    lines = [r.getMessage() for r in caplog.records if "refused our credentials" in r.getMessage()]
    assert len(lines) == 1 and "standIn" not in lines[0] and "rzp_" not in lines[0], lines
    assert samples(client.get("/metrics").text)[
        ("webhook_ledger_provider_calls_total", (("provider", "razorpay"), ("result", "401")))] == 1


# -- any order, two hosts at once --------------------------------------------------------------------

def test_each_razorpay_movement_fetched_applies_once_from_two_hosts_at_once(gunicorn, db, razorpay_api):
    """The payment, a refund, a refund that failed, a dispute lost then won: each event delivered twice to each
    of two hosts at once, shuffled; each host fetches from Razorpay's API. Retried on 503, 409 in_progress and
    422 (a movement before its payment's credit), as Razorpay retries: every movement applies once."""
    hosts = [gunicorn(workers=1, threads=4, PROVIDER_SLOTS=4) for _ in range(2)]
    payment_id, refund_id, failed_id, dispute_id = new_id("pay"), new_id("rfnd"), new_id("rfnd"), new_id("disp")
    events = _movements(payment_id, refund_id, failed_id, dispute_id)
    for event in events:
        razorpay_api.add(*_entities(event))  # each entity's latest state, as the events come in order
    deliveries = [(host, encode(event), header_id) for event, header_id in
                  [(event, new_id("evt")[4:]) for event in events] for host in hosts for _ in range(2)]
    random.Random(35).shuffle(deliveries)

    def deliver(delivery):
        host, body, header_id = delivery
        for _ in range(300):
            answer = send(host.base, body, razorpay_headers(body, header_id), source=SOURCE)
            if answer.status not in (409, 422, 503) or answer.json.get("error") == "payment_mismatch":
                return answer.status
            time.sleep(0.02)
        return answer.status

    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(deliver, deliveries)) == {200}
    assert balance(db, BOB) == 90000  # 1000 - 100 (refund); the failed refund and the dispute won move nothing
    net = {}
    for kind, movement, cents in _journal(db):
        if kind != "credit":
            net.setdefault(movement, []).append(cents)
    assert {movement: sum(rows) for movement, rows in net.items()} == {
        refund_id: -10000, **{m: 0 for m in (failed_id, dispute_id) if m in net}}
    assert all(len(rows) <= 2 for rows in net.values())
    assert db.execute("SELECT count(*) FROM ledger_journal WHERE kind = 'credit'").fetchone()[0] == 1
    assert_ledger_consistent(db, INR)


# -- the settings ----------------------------------------------------------------------------------

def _settings(**razorpay):
    environ = {"DATABASE_URL": "postgresql://u@localhost/d", "REDIS_URL": "redis://localhost",
               "WEBHOOK_SOURCES": "razorpay",
               "WEBHOOK_RAZORPAY_SECRET": "razorpay-webhook-secret-0123",
               **{f"WEBHOOK_RAZORPAY_{key}": value for key, value in razorpay.items()}}
    return app_config.from_env(environ)


@pytest.mark.unit
@pytest.mark.parametrize("settings_, message", [
    ({"FETCH": "true"}, "WEBHOOK_RAZORPAY_API_KEY is required to fetch events under razorpay: Razorpay's API key, "
                        "<key id>:<key secret>"),
    ({"FETCH": "true", "API_KEY": "rzp_live_onlyTheKeyId"},
     "WEBHOOK_RAZORPAY_API_KEY must be Razorpay's API key written <key id>:<key secret>"),
    ({"FETCH": "true", "API_KEY": ":aSecretWithoutItsKeyId"},
     "WEBHOOK_RAZORPAY_API_KEY must be Razorpay's API key written <key id>:<key secret>"),
    ({"FETCH": "true", "API_KEY": "rzp_live_key:"},
     "WEBHOOK_RAZORPAY_API_KEY must be Razorpay's API key written <key id>:<key secret>"),
])
def test_bad_razorpay_fetch_settings_stop_with_one_line_naming_the_setting(settings_, message):
    with pytest.raises(app_config.ConfigError) as refused:
        _settings(**settings_)
    assert refused.value.format_message() == f"configuration error: {message}"
    assert "\n" not in message and "aSecret" not in message


@pytest.mark.unit
def test_a_razorpay_source_fetches_only_when_told():
    assert _settings().sources["razorpay"].fetch is False
    fetching = _settings(FETCH="true", API_KEY="rzp_live_key:aSecret0123").sources["razorpay"]
    assert fetching.fetch is True and "aSecret" not in repr(fetching)
