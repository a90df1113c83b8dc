"""Parsing an event body and what it does to the ledger (effect_of, by RULES): pure functions, no I/O.
Each scheme's id, type and data are in docs/providers/; the vocabulary (Event, Effect) is app/core/vocabulary.py's."""

import dataclasses
import hashlib
import json
import uuid
from typing import cast

from ..core.provider import recorded
from ..core.vocabulary import (
    CURRENCY,
    DEFAULT_POLICY,
    DEFAULT_SOURCE,
    LEDGERS_CURRENCY,
    MAX_APP_KEY_CHARS,
    MAX_CENTS,
    MAX_ID_CHARS,
    MAX_KEY_CHARS,
    Effect,
    Event,
    Fields,
    Headers,
    InvalidEventError,
    InvalidJSONError,
    Kind,
    Metadata,
    NoUser,
    Policy,
    Rule,
    State,
    StoredBodyError,
    UnprocessableError,
    Users,
    app_key_of,
    is_cents,
    is_id,
    is_uuid,
    load,
    minor_units,
    uuid_text,
)
from ..providers import PROVIDERS, RULES, of

# Re-exported: what the rest of the app and the tests read from here.
__all__ = ["DEFAULT_POLICY", "DEFAULT_SOURCE", "EFFECT_VERSION", "MAX_CENTS", "MAX_ID_CHARS", "MAX_KEY_CHARS",
           "RULES", "Effect", "Event", "InvalidEventError", "InvalidJSONError", "Kind", "NoUser",
           "Policy", "State", "StoredBodyError", "UnprocessableError", "Users", "effect_of", "minor_units", "parse",
           "read_when_fetched", "stored_event"]

# The rule effect_of hashes effects by; webhook_events.effect_version's default. Change
# both when the rule changes (the default in schema.sql and in a new migration):
# `flask init-db` then recomputes the stored effects (ledger.recompute_effects).
EFFECT_VERSION = 9


def parse(body: bytes, scheme: str = "hmac-sha256", headers: Headers | None = None,
          source: str = DEFAULT_SOURCE) -> Event:
    """Return the event in body (and, per scheme, headers), or raise InvalidJSONError / InvalidEventError."""
    document = load(body)
    provider = of(scheme)
    event = provider.parse(document, body, {} if headers is None else headers, source)
    if provider.type_header is not None and "type" not in document and event.type in RULES:
        raise InvalidEventError(f"a payment must name its type in the signed body, not in the {provider.type_header} "
                                "header")
    return event


def stored_event(source: str, event_id: str, event_type: str, body: bytes, body_sha256: bytes | None,
                 fetched: bytes | None = None) -> Event:
    """The Event of a stored row, its bytes checked against their SHA-256 and read as the live path reads them
    (for replay and verify); fetched, the provider's bytes when kept, is read in place of body."""
    if body_sha256 is not None and hashlib.sha256(body).digest() != bytes(body_sha256):
        raise StoredBodyError("its stored bytes do not match their SHA-256")
    try:
        document = load(body if fetched is None else bytes(fetched))
        for provider in PROVIDERS.values():
            event = provider.stored and provider.stored(event_id, event_type, document, fetched is not None, body,
                                                        source)
            if event:
                return event
    except InvalidJSONError as exc:
        raise StoredBodyError(f"its stored bytes do not parse: {exc}") from None
    return recorded(event_id, event_type, document, body, source)


# Fields of the types _problem has just checked (for the type checker; built once, not per event).
_CheckedFields = tuple[str, "str | Metadata | None", int, str, object, str | None, State | None, str | None,
                       str | None]


def effect_of(event: Event, policy: Policy = DEFAULT_POLICY) -> Effect:
    """What applying event does to the ledger under policy; never raises (a refusal is the Effect's problem)."""
    # A thin event's copies compare by what their signed body names (Rule.compared_by), not by the money its
    # object had when each was fetched.
    effect = _effect_of(event, policy)
    rule = RULES.get(event.type)
    compared_by = rule.compared_by(event) if rule is not None and rule.compared_by is not None else None
    return effect if compared_by is None else dataclasses.replace(effect, sha256=compared_by)


def read_when_fetched(event_type: str) -> bool:
    """Whether an event of this type is read from its object as the provider has it when fetched (a thin
    event), so its metadata may have changed since the event: money.sql's read_when_fetched."""
    rule = RULES.get(event_type)
    return rule is not None and rule.compared_by is not None


def _effect_of(event: Event, policy: Policy) -> Effect:
    """effect_of's rule, by the event's fields."""
    # A refusal by a setting (Effect.setting) hashes as the effect that applies, so that the same bytes compare equal
    # once the setting allows them. (A currency the event leaves implied is the policy's, as if named: the only value
    # of the policy in a hash, and one no setting refuses.)
    rule = _rule_of(event)
    fields = rule.read(event) if rule else None
    if rule is None or fields is None:  # a type, or an event, that moves no money
        return Effect(None, sha256=_sha256([event.type]))
    if not isinstance(fields, str) and fields.currency == LEDGERS_CURRENCY:
        # Compared as the ledger's currency named: the same credit as one that names it.
        fields = fields._replace(currency=policy.currency)
    problem = fields if isinstance(fields, str) else _problem(rule, fields)
    # A refused effect never compares equal to one that applies, however
    # close their values (a null currency is refused, a missing one implied).
    # A connected account is hashed through the keys it scopes, not as a field of its own: an event without one
    # hashes as the rule without accounts did (tests/providers/stripe/test_connect.py pins it).
    sha256 = _sha256([event.type, "refused" if problem else "applies",
                      *([fields] if isinstance(fields, str) else fields[:-1])])
    if problem:
        return Effect(None, problem=problem, sha256=sha256)
    payment_id, user_id, amount, currency, livemode, movement_id, state, customer, account = \
        cast(_CheckedFields, fields)
    setting, problem = _refused_by(rule, livemode, currency, policy)
    users, user = None, cast(object, user_id)
    if isinstance(user_id, Metadata):  # which key names the user is a setting: read after the hash
        users = policy.users_of(event.source)
        user = uuid_text(user_id.get(users.metadata_key))
    app_key = app_key_of(user)  # the application's own key of the user, which money.sql resolves
    if app_key is not None:
        user = None
    elif users is not None and user is not None and not is_uuid(user) and not problem:
        label = cast(Metadata, user_id).label(users.metadata_key)
        setting, problem = users.setting, (f"{label} must be a user's UUID or the application's key of one "
                                           f"(1 to {MAX_APP_KEY_CHARS} characters) ({users.setting})")
    if rule.kind == Kind.LINK and user is None and app_key is None and not problem:  # no user named: nothing to link
        return Effect(None, sha256=sha256)
    return Effect(rule.kind, payment_id, uuid.UUID(user) if is_uuid(user) else None, amount, currency,
                  problem=problem, sha256=sha256, movement_id=movement_id, state=state, setting=setting,
                  customer_id=customer, users=users, account=account, app_key=app_key)


def _sha256(values: list[object]) -> bytes:
    return hashlib.sha256(json.dumps(values, sort_keys=True, separators=(",", ":")).encode()).digest()


def _problem(rule: Rule, fields: Fields) -> str | None:
    """Why an effect with these fields cannot apply whatever the settings (a 422's message), or None."""
    labels = rule.labels
    # A connected account's keys are its id, "/" and the object's id, which its provider's rule bounded.
    key_chars = MAX_ID_CHARS if fields.account is None else MAX_KEY_CHARS
    if rule.kind == Kind.LINK:  # no money: a customer, and a user the metadata names
        return None if is_id(fields.customer, key_chars) else \
            f"{labels.customer} must be a customer id of 1 to {MAX_ID_CHARS} characters"
    if not (isinstance(fields.currency, str) and CURRENCY.fullmatch(fields.currency)):
        return f"{labels.currency} must be a currency's three-letter code"
    if not is_id(fields.payment_id, key_chars):
        return f"{labels.payment_id} must be a payment id of 1 to {MAX_ID_CHARS} characters"
    if rule.kind == Kind.CREDIT and not (isinstance(fields.user_id, Metadata) or is_uuid(fields.user_id)
                                         or app_key_of(fields.user_id) is not None):
        return f"{labels.user_id} must be a user's UUID or the application's key of one (1 to {MAX_APP_KEY_CHARS} " \
               "characters)"
    if fields.customer is not None and not is_id(fields.customer, key_chars):
        return f"{labels.customer} must be a customer id of 1 to {MAX_ID_CHARS} characters"
    if not is_cents(fields.amount):
        if isinstance(fields.amount, int) and not isinstance(fields.amount, bool) and fields.amount > MAX_CENTS:
            return f"{labels.amount} must be at most {MAX_CENTS} (a balance's BIGINT)"
        return f"{labels.amount} must be a positive integer"
    if rule.kind in (Kind.REFUND, Kind.DISPUTE):
        if not is_id(fields.movement_id, key_chars):
            return f"{labels.movement_id} must be an id of 1 to {MAX_ID_CHARS} characters"
        if not isinstance(fields.state, State):
            return f"{labels.state} must be one of {', '.join(rule.statuses or State)}"
    return None


def _refused_by(rule: Rule, livemode: object, currency: str, policy: Policy) -> tuple[str | None, str | None]:
    """The setting that refuses an effect under policy, and why (a 422's message); (None, None) if none does."""
    if livemode is False and not policy.accept_test_events:
        return "STRIPE_ACCEPT_TEST_EVENTS", \
            "a test-mode event (livemode is not true); set STRIPE_ACCEPT_TEST_EVENTS=true to accept"
    # A credit must be in the ledger's currency; every other movement in its
    # payment's (apply_event checks), which LEDGER_CURRENCY may have been
    # when it was credited.
    if rule.kind == Kind.CREDIT and currency != policy.currency:
        return "LEDGER_CURRENCY", f"{rule.labels.currency} must be the ledger's currency, {policy.currency!r}"
    return None, None


def _rule_of(event: Event) -> Rule | None:
    """event's rule, by its type, refined by its content where the rule says (a Checkout Session's mode, the shape a
    type two providers send came in)."""
    rule = RULES.get(event.type)
    return rule.refine(event) if rule is not None and rule.refine is not None else rule
