"""The ledger's unit of work: one delivery of one event, applied in ONE statement, money.sql's `apply_event`
(docs/design.md, "Where the rule lives"); also `flask ledger adjust`'s call and the vocabulary of `spend`."""

import logging
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

import psycopg

from ..intake.events import (
    DEFAULT_POLICY,
    EFFECT_VERSION,
    MAX_KEY_CHARS,
    Effect,
    Event,
    Policy,
    StoredBodyError,
    UnprocessableError,
    effect_of,
    stored_event,
)
from . import waiting
from .db import Pool, one_query, transaction
from .outcome import Outcome

log = logging.getLogger(__name__)


class PayloadMismatchError(ValueError):
    """This event id was stored before with a different effect: answered 409."""


class PaymentMismatchError(ValueError):
    """The event's payment (or refund, or dispute) was announced by another event otherwise: 409."""


class Status(StrEnum):
    """An event's webhook_events.status."""

    COMPLETED = "completed"  # its effect is committed
    FAILED = "failed"  # its effect cannot apply (last_error says why): a retry or a replay may apply it
    IGNORED = "ignored"  # not ours (a payment naming no user under NO_USER=ignore): `events replay` may apply it
    DISMISSED = "dismissed"  # a failed event closed by an operator (`events dismiss`): not replayed by --all-failed


class Origin(StrEnum):
    """Where a stored event's bytes of record came from (webhook_events.origin)."""

    DELIVERY = "delivery"  # a webhook received
    RECONCILE = "reconcile"  # the provider's event list (`flask reconcile`): its delivery was lost


class Change(StrEnum):
    """The balance change a delivery made (apply_event's `change`): logged and counted."""

    CREDIT = "credit"  # a payment credited
    REFUND = "refund"  # a refund taken from the payment's user (by its object, or what a higher total adds)
    REFUND_REVERSED = "refund_reversed"  # a failed or canceled refund given back
    DISPUTE_WITHDRAWN = "dispute_withdrawn"  # a dispute's funds taken from the payment's user
    DISPUTE_REINSTATED = "dispute_reinstated"  # a dispute's funds given back
    PAYMENT_DUPLICATE = "payment_duplicate"  # a credited payment announced again by another event: nothing
    # Announced again by its twin naming another user, one of them read from its object as it is now (its metadata
    # changed after the payment succeeded): nothing, the first credit stands; logged and counted.
    PAYMENT_USER_DISAGREED = "payment_user_disagreed"


class Entry(StrEnum):
    """A journal row that no event wrote (ledger_journal.kind): money.sql's adjust, spend and
    move_payment_to_account (and migration 012) write them."""

    ADJUSTMENT = "adjustment"  # an operator's correction, either sign, with its reason and who made it
    SPEND = "spend"  # the application spent the user's credit (or captured a hold), once per reference it gave
    GIVE_BACK = "give_back"  # the application gave a spend back, once, naming the spend's reference
    # 0 cents: a payment keyed in a connected account, its key before in moved_from (the journal is append-only)
    PAYMENT_MOVED = "payment_moved"


class SpendOutcome(StrEnum):
    """What a call of money.sql's spend came to (its `outcome`); a refusal raises instead."""

    SPENT = "spent"  # this call spent the credit
    DUPLICATE = "duplicate"  # a call with the same reference, user and amount spent it before: nothing changed


class HoldOutcome(StrEnum):
    """What a call of money.sql's place_hold, capture_hold or release_hold came to; a refusal raises instead."""

    HELD = "held"  # place_hold reserved the credit
    CAPTURED = "captured"  # capture_hold spent what the work cost, the rest freed
    RELEASED = "released"  # release_hold freed it all
    DUPLICATE = "duplicate"  # the same call was made before: nothing changed


class HoldState(StrEnum):
    """A hold's state (holds.state); a 'held' hold past its expiry counts for nothing all the same."""

    HELD = "held"
    CAPTURED = "captured"
    RELEASED = "released"


class GiveBackOutcome(StrEnum):
    """What a call of money.sql's give_back came to; a refusal raises instead."""

    GIVEN_BACK = "given_back"  # this call gave the spend back
    DUPLICATE = "duplicate"  # it was given back before: nothing changed


class Result(NamedTuple):
    """What applying an event came to, as apply_event returns it."""

    outcome: Outcome
    problem: str | None = None
    # The SHA-256 of the bytes the event's row held when this delivery found it (None when it inserted the row; on a
    # PROCESSED retry of a failed event, those it replaced): unlike the delivery's own, the same effect in other bytes.
    stored_sha256: bytes | None = None
    change: Change | None = None
    balance_after: int | None = None  # the user's balance after a CREDIT or a REFUND

    @property
    def committed(self) -> bool:
        """Whether the event's effect is committed (by this delivery or an earlier one)."""
        return self.outcome in (Outcome.PROCESSED, Outcome.DUPLICATE)

    def raise_for_outcome(self) -> "Result":
        """Raise the exception that answers a FAILED or mismatched result; return self otherwise."""
        if self.outcome == Outcome.FAILED:
            raise UnprocessableError(self.problem)
        if self.outcome == Outcome.PAYLOAD_MISMATCH:
            raise PayloadMismatchError("this event id was delivered before with a different effect")
        if self.outcome == Outcome.PAYMENT_MISMATCH:
            raise PaymentMismatchError(self.problem)
        return self


# money.sql's ledger_delivery, attribute by attribute in its order: apply_event's one input. Its sha256 is the
# body's, payload_sha256 here (a type's attribute is renamed only by a migration: docs/design.md, Names kept).
DELIVERY = (("source", "text"), ("event_id", "text"), ("type", "text"), ("body", "bytea"), ("sha256", "bytea"),
            ("effect", "bytea"), ("problem", "text"), ("kind", "text"), ("payment", "text"), ("user_id", "uuid"),
            ("amount", "bigint"), ("currency", "text"), ("movement", "text"), ("state", "text"),
            ("ledger_currency", "text"), ("test_events", "boolean"), ("origin", "text"), ("customer", "text"),
            ("user_key", "text"), ("no_user", "text"), ("account", "text"), ("app_key", "text"))
APPLY_EVENT = ("SELECT * FROM apply_event(ROW("
               + ", ".join(f"%({name})s::{type_}" for name, type_ in DELIVERY) + ")::ledger_delivery)")


# The provider's bytes of a fetched event, kept beside the delivered ones on the row this transaction wrote
# (inserted, or a failed event tried again: updated_at is the transaction's now()); in the same message.
KEEP_FETCHED = """;
    UPDATE webhook_events SET fetched = %(fetched)s
    WHERE source = %(source)s AND event_id = %(event_id)s AND updated_at = now()
"""


def apply_event(pool: Pool, event: Event, effect: Effect, payload_sha256: bytes, policy: Policy,
                origin: Origin | None = Origin.DELIVERY, fetched: bytes | None = None,
                ends_wait: bool = False) -> Result:
    """Record event (its effect effect_of(event, policy), the received bytes' hash payload_sha256) and apply the
    effect atomically; return a Result."""
    # A failure is committed (attempts, last_error) with no balance change, a payload mismatch as a count alone.
    # policy is recorded with the event, origin with its bytes (None: a replay of the stored bytes keeps the row's),
    # fetched (the provider's bytes that event was read from) beside them; ends_wait: the event's waiting
    # notification, if any, is deleted in the same statement (app/store/waiting.py).
    params = apply_event_params(event, effect, payload_sha256, policy, origin)
    if fetched is not None:
        params["fetched"] = fetched
    statement = APPLY_EVENT + (KEEP_FETCHED if fetched is not None else "") + (waiting.DONE if ends_wait else "")
    row = one_query(pool, statement, params)
    assert row is not None  # a SELECT of a function returning one row
    outcome, problem, stored_sha256, change, balance_after = row
    if change == Change.PAYMENT_USER_DISAGREED:
        log.warning("twins disagree on a payment's user (source %s): %s", event.source, problem)
    return Result(Outcome(outcome), problem, stored_sha256, change and Change(change), balance_after)


def apply_event_params(event: Event, effect: Effect, payload_sha256: bytes, policy: Policy,
                       origin: Origin | None) -> dict[str, object]:
    """APPLY_EVENT's parameters (DELIVERY's names), for apply_event's arguments."""
    users = policy.users_of(event.source)
    return {"source": event.source, "event_id": event.id, "type": event.type, "body": event.body,
            "sha256": payload_sha256, "effect": effect.sha256, "problem": effect.problem, "kind": effect.kind,
            "payment": effect.payment_id, "user_id": effect.user_id, "amount": effect.amount_cents,
            "currency": effect.currency, "movement": effect.movement_id, "state": effect.state,
            "ledger_currency": policy.currency, "test_events": policy.accept_test_events, "origin": origin,
            "customer": effect.customer_id, "account": effect.account, "app_key": effect.app_key,
            # The source's way of naming users, recorded with the event (verify reads a credit by it).
            "user_key": users.metadata_key, "no_user": users.no_user}


STORED_EVENT = """
    SELECT event_type, status, body, payload_sha256, fetched, effect_sha256 FROM webhook_events
    WHERE source = %s AND event_id = %s
"""
# The effect stored for an event whose provider had no record of it (app/receiver/fetch.py): 32 zero bytes, no
# effect's SHA-256, which any later effect of the id replaces (money.sql).
UNKNOWN_EFFECT = bytes(32)


def unvouched(fetched: bytes | None, effect_sha256: bytes | None) -> bool:
    """Whether a stored row is a notification nobody vouches for: its provider had no record of it when asked, so
    what its body says is not what it moves, and only a new fetch may decide it."""
    return fetched is None and effect_sha256 is not None and bytes(effect_sha256) == UNKNOWN_EFFECT


class Refetch(Protocol):
    """How replay asks the provider again for an event it had no record of (fetch.Providers.fetch)."""

    def __call__(self, event: Event) -> tuple[Event, Effect, bytes | None]: ...


def replay(pool: Pool, source: str, event_id: str, policy: Policy = DEFAULT_POLICY,
           refetch: Refetch | None = None) -> Result | None:
    """Re-apply a stored event from its stored bytes, as a new delivery of them would; None if none is stored."""
    # A completed event is left as it is (DUPLICATE, "already completed"); stored bytes that cannot be replayed are
    # a FAILED result saying why. A fetching source's event is read from the provider's bytes kept with it; when
    # there are none (the provider had no record of it), refetch asks the provider again.
    with transaction(pool) as conn:
        row = conn.execute(STORED_EVENT, [source, event_id]).fetchone()
    if row is None:
        return None
    event_type, status, body, payload_sha256, fetched, effect_sha256 = row
    if status == Status.COMPLETED:
        return Result(Outcome.DUPLICATE, "already completed")
    if refetch is None and unvouched(fetched, effect_sha256):
        return Result(Outcome.FAILED, "not replayed: its provider had no record of it, and this command cannot ask "
                                      "again (the source is not served here with its API key)")
    try:
        event = stored_event(source, event_id, event_type, body, payload_sha256, fetched)
    except StoredBodyError as exc:
        return Result(Outcome.FAILED, f"not replayed: {exc}")
    effect = effect_of(event, policy)
    if fetched is None and refetch is not None:
        event, effect, fetched = refetch(event)
    result = apply_event(pool, event, effect, bytes(payload_sha256), policy, origin=None,
                         fetched=None if fetched is None else bytes(fetched))
    if result.outcome == Outcome.DUPLICATE and result.change is None:
        return result._replace(problem="completed meanwhile by another delivery")
    return result


# Rows whose effect an older rule computed, a batch at a time; SKIP LOCKED
# leaves a row that a delivery holds now to that delivery, which rewrites it.
OLD_EFFECTS = """
    SELECT id, source, event_id, event_type, body, payload_sha256, fetched,
           effect_sha256
    FROM webhook_events
    WHERE effect_version IS DISTINCT FROM %(version)s
    ORDER BY id LIMIT %(batch)s FOR UPDATE SKIP LOCKED
"""
SET_EFFECT = "UPDATE webhook_events SET effect_sha256 = %s, effect_version = %s WHERE id = %s"
EFFECTS_BATCH = 1000
def recompute_effects(pool: Pool, policy: Policy = DEFAULT_POLICY) -> int:
    """Recompute, from their stored bytes, the effects that another rule hashed; return how many."""
    # Run by `flask init-db` after the schema: until then a re-delivery of such an event would not compare equal to
    # its own stored effect. Safe to run twice, and from two hosts at once.
    done = 0
    while True:
        with transaction(pool) as conn:
            rows = conn.execute(OLD_EFFECTS, {"version": EFFECT_VERSION, "batch": EFFECTS_BATCH}).fetchall()
            for row_id, source, event_id, event_type, body, payload_sha256, fetched, stored in rows:
                if unvouched(fetched, stored):
                    conn.execute(SET_EFFECT, [stored, EFFECT_VERSION, row_id])  # still only a fetch decides it
                    continue
                try:
                    effect = effect_of(stored_event(source, event_id, event_type, bytes(body), payload_sha256, fetched),
                                       policy)
                except StoredBodyError:
                    effect = None  # unreadable bytes: verify reports them; compared by bytes meanwhile
                conn.execute(SET_EFFECT, [effect and effect.sha256, EFFECT_VERSION, row_id])
        done += len(rows)
        if len(rows) < EFFECTS_BATCH:
            return done


ADD_USER = "SELECT added, opening_balance_cents FROM add_user(p_user => %(user)s, p_opening => %(cents)s)"
LINK_CUSTOMER = ("SELECT linked_at FROM link_customer(p_source => %(source)s, p_customer => %(customer)s,"
                 " p_user => %(user)s, p_by => %(by)s)")


def add_user(conn: psycopg.Connection[Any], user_id: uuid.UUID, cents: int) -> tuple[bool, int]:
    """Add user_id with an opening balance of cents unless it exists (money.sql's add_user): (added, its opening)."""
    row = conn.execute(ADD_USER, {"user": user_id, "cents": cents}).fetchone()
    assert row is not None  # a SELECT of a function returning one row
    return row[0], row[1]


ASSIGN_PAYMENT_USER = ("SELECT user_now, assigned, credited FROM assign_payment_user(p_source => %(source)s,"
                       " p_payment => %(payment)s, p_user => %(user)s, p_by => %(by)s)")


class Assignment(NamedTuple):
    """What money.sql's assign_payment_user found: the payment's user now (None: none), and how."""

    user_id: uuid.UUID | None
    assigned: bool  # by this call
    credited: bool  # the payment was credited (to user_id) already: nothing was assigned


def assign_payment_user(conn: psycopg.Connection[Any], source: str, payment_id: str, user_id: uuid.UUID,
                        actor: str) -> Assignment:
    """Assign user_id to source's payment_id unless it has a user, credited or assigned (money.sql's
    assign_payment_user)."""
    row = conn.execute(ASSIGN_PAYMENT_USER, {"source": source, "payment": payment_id, "user": user_id,
                                             "by": actor}).fetchone()
    assert row is not None  # a SELECT of a function returning one row
    return Assignment(*row)


MOVE_PAYMENT_TO_ACCOUNT = ("SELECT * FROM move_payment_to_account(p_source => %(source)s, p_payment => %(payment)s,"
                           " p_account => %(account)s, p_max_chars => %(max_chars)s, p_by => %(by)s)")
# The SQLSTATEs money.sql's move_payment_to_account refuses with, changing nothing (its header lists them).
MOVE_REFUSALS = (psycopg.errors.NoDataFound, psycopg.errors.UniqueViolation, psycopg.errors.InvalidParameterValue)


class MoveRefusedError(ValueError):
    """money.sql's move_payment_to_account refused, for the reason its message gives: nothing was changed."""


class Moved(NamedTuple):
    """A payment keyed in its connected account: its new key, how many movements moved, and how many journal rows
    are read under it from now on (they keep their key: a 'payment_moved' row says the move)."""

    payment_id: str
    movements: int
    journal_rows: int


def move_payment_to_account(conn: psycopg.Connection[Any], source: str, payment_id: str, account: str,
                            actor: str) -> Moved:
    """Key source's payment_id, keyed in no account, in the Stripe connected account (money.sql's
    move_payment_to_account), journaled as actor's move, in conn's transaction; MoveRefusedError when refused."""
    # A key in an account is held to what the live rule holds it to (app/providers/stripe/rules.py's in_account): an
    # account id, "/" and an id, each MAX_ID_CHARS at most.
    params = {"source": source, "payment": payment_id, "account": account, "max_chars": MAX_KEY_CHARS, "by": actor}
    try:
        row = conn.execute(MOVE_PAYMENT_TO_ACCOUNT, params).fetchone()
    except MOVE_REFUSALS as exc:
        raise MoveRefusedError(exc.diag.message_primary) from None
    assert row is not None  # a SELECT of a function returning one row
    return Moved(*row)


def link_customer(conn: psycopg.Connection[Any], source: str, customer_id: str, user_id: uuid.UUID,
                  actor: str) -> datetime | None:
    """Link source's customer_id to user_id unless it is linked (money.sql's link_customer): when, or None."""
    row = conn.execute(LINK_CUSTOMER, {"source": source, "customer": customer_id, "user": user_id, "by": actor})
    linked_at: datetime | None = row.fetchone()[0]  # type: ignore[index]
    return linked_at


ADJUST = """
    SELECT * FROM adjust(p_user => %(user_id)s, p_cents => %(cents)s, p_reason => %(reason)s, p_actor => %(actor)s,
                         p_source => %(source)s, p_payment => %(payment_id)s)
"""
# The SQLSTATEs money.sql's adjust refuses with, changing nothing (its header lists them): an amount, reason,
# actor or payment it cannot journal; an unknown user or payment; a balance that would leave BIGINT's range.
ADJUST_REFUSALS = (psycopg.errors.InvalidParameterValue, psycopg.errors.NoDataFound,
                   psycopg.errors.NumericValueOutOfRange)


class AdjustmentError(ValueError):
    """money.sql's adjust refused the adjustment, for the reason its message gives: nothing was changed."""


class Adjustment(NamedTuple):
    """An adjustment made: its ledger_journal row and the balance it left."""

    journal_id: int
    balance_after: int


def adjust(pool: Pool, user_id: uuid.UUID, cents: int, reason: str, actor: str,
           payment: tuple[str, str] | None = None) -> Adjustment:
    """Add cents (either sign, not 0) to user_id's balance, journaled as an adjustment with reason and actor (and
    payment, the (source, payment id) whose credit it corrects); AdjustmentError when refused."""
    # One statement (money.sql's adjust): the balance and its journal row change together or not at all.
    source, payment_id = payment or (None, None)
    params = {"user_id": user_id, "cents": cents, "reason": reason, "actor": actor, "source": source,
              "payment_id": payment_id}
    try:
        row = one_query(pool, ADJUST, params)
    except ADJUST_REFUSALS as exc:
        raise AdjustmentError(exc.diag.message_primary) from None
    assert row is not None  # a SELECT of a function returning one row
    return Adjustment(*row)
