"""Which settings `flask events replay` decides a stored event under: those recorded with it, except the ones that
refused it, which this shell's replace; or why this shell cannot decide it (docs/operations.md, "Replaying")."""

from dataclasses import replace
from typing import NamedTuple

from psycopg.rows import namedtuple_row

from ..core.vocabulary import Effect, Kind, NoUser, Policy
from ..intake.events import StoredBodyError, effect_of, stored_event
from ..store import ledger
from ..store.db import NamedRow, Pool, transaction

# What the event was decided under (money.sql records it with the event; NULL on rows older than that).
RECORDED = """
    SELECT event_type, status, body, payload_sha256, fetched, effect_sha256,
           ledger_currency, test_events_accepted, user_metadata_key, no_user
    FROM webhook_events WHERE source = %s AND event_id = %s
"""


class Skip(NamedTuple):
    """Why this shell does not replay an event: one line, the same for every event skipped for it."""

    reason: str


def policy_for(pool: Pool, source: str, event_id: str, shell: Policy, configured: set[str]) -> Policy | Skip:
    """The policy event_id is replayed under, or why it is skipped (its row left as it is)."""
    # An event is decided again under the settings it was decided under. The setting that refused it
    # (Effect.setting), or for a payment that named no user the source's metadata key and WEBHOOK_NO_USER, are this
    # shell's: an operator replays because they changed it.
    with transaction(pool) as conn:
        row: NamedRow | None = conn.cursor(row_factory=namedtuple_row).execute(RECORDED, [source, event_id]).fetchone()
    if row is None or row.status == ledger.Status.COMPLETED:
        return shell  # ledger.replay says so
    # Its provider had no record of it: only a new fetch decides it, which ledger.replay refuses, writing
    # nothing, where the source is not served.
    unasked = ledger.unvouched(row.fetched, row.effect_sha256)
    if source not in configured:
        return shell if unasked else Skip("its source is not configured in this shell (WEBHOOK_SOURCES, "
                                          "WEBHOOK_SECRET)")
    recorded = _recorded(row, source, shell)
    if _settings(recorded, source) == _settings(shell, source):
        return shell
    if unasked:
        return recorded
    try:
        event = stored_event(source, event_id, row.event_type, row.body, row.payload_sha256, row.fetched)
    except StoredBodyError:
        return recorded  # ledger.replay says why it cannot
    refused = effect_of(event, recorded)
    policy = _lifted(recorded, shell, source, refused)
    if policy.currency != shell.currency:
        return Skip(f"decided under LEDGER_CURRENCY={recorded.currency}, and the ledger's is {shell.currency}")
    setting = effect_of(event, policy).setting
    if setting is not None and _values(policy, source).get(setting) != _values(recorded, source).get(setting):
        return Skip(f"this shell's {setting} refuses it; it was decided under {_named_settings(recorded, source)}")
    return policy


def _recorded(row: NamedRow, source: str, shell: Policy) -> Policy:
    """The policy row was decided under; a setting not recorded with it (an older row) is the shell's."""
    users = shell.users_of(source)
    users = replace(users, metadata_key=row.user_metadata_key or users.metadata_key,
                    no_user=NoUser(row.no_user) if row.no_user else users.no_user)
    accepted = shell.accept_test_events if row.test_events_accepted is None else row.test_events_accepted
    return Policy(row.ledger_currency or shell.currency, accepted, {**shell.users, source: users})


def _lifted(recorded: Policy, shell: Policy, source: str, refused: Effect) -> Policy:
    """recorded, with the settings that refused it taken from shell."""
    users, theirs = recorded.users_of(source), shell.users_of(source)
    if refused.setting == "STRIPE_ACCEPT_TEST_EVENTS":
        return replace(recorded, accept_test_events=shell.accept_test_events)
    if refused.setting == "LEDGER_CURRENCY":
        return replace(recorded, currency=shell.currency)
    if refused.setting == users.setting or (refused.kind == Kind.CREDIT and not refused.names_user):
        users = replace(users, metadata_key=theirs.metadata_key, no_user=theirs.no_user)
        return replace(recorded, users={**recorded.users, source: users})
    return recorded


def _values(policy: Policy, source: str) -> dict[str, object]:
    """The value of each setting that may refuse an effect (Effect.setting), by its name."""
    users = policy.users_of(source)
    return {"LEDGER_CURRENCY": policy.currency, "STRIPE_ACCEPT_TEST_EVENTS": policy.accept_test_events,
            users.setting: users.metadata_key}


def _settings(policy: Policy, source: str) -> tuple[object, ...]:
    users = policy.users_of(source)
    return policy.currency, policy.accept_test_events, users.metadata_key, users.no_user


def _named_settings(policy: Policy, source: str) -> str:
    users = policy.users_of(source)
    no_user = users.setting.removesuffix("USER_METADATA_KEY") + "NO_USER"
    return (f"LEDGER_CURRENCY={policy.currency}, STRIPE_ACCEPT_TEST_EVENTS={str(policy.accept_test_events).lower()}, "
            f"{users.setting}={users.metadata_key}, {no_user}={users.no_user}")
