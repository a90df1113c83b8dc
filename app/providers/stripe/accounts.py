"""Which Stripe account an event's objects are in: a Connect event's `account`, a thin event's context
(docs/providers/stripe.md, "Connect")."""

import re
from collections.abc import Mapping
from typing import Any, TypeGuard

from ...core.vocabulary import MAX_ID_CHARS, Event, InvalidEventError

# A connected account's id: a Connect event's top-level `account` (https://docs.stripe.com/api/events/object).
ACCOUNT = re.compile(r"acct_[A-Za-z0-9]+")
# A thin event's `object` (thin.py reads the rest of it).
THIN_OBJECT = "v2.core.event"
# Stripe-Context's value: account ids, a path of them for an account below a connected one (docs.stripe.com/context).
# Each an account id, as ACCOUNT (Stripe-generated: MAX_ID_CHARS at most): the last is the account the keys are in
# (account_of).
CONTEXT = re.compile(rf"acct_[A-Za-z0-9]{{1,{MAX_ID_CHARS - 5}}}(/acct_[A-Za-z0-9]{{1,{MAX_ID_CHARS - 5}}}){{0,3}}")


def is_account(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and len(value) <= MAX_ID_CHARS and ACCOUNT.fullmatch(value) is not None


def check_account(document: Mapping[str, Any]) -> None:
    """InvalidEventError unless a snapshot event's `account`, when it has one, is a connected account's id."""
    account = document.get("account")
    if account is not None and not is_account(account):
        raise InvalidEventError(f"'account' must be a connected account's id (acct_ and letters or digits), "
                                f"1 to {MAX_ID_CHARS} characters")


def is_thin(document: Mapping[str, Any]) -> bool:
    return document.get("object") == THIN_OBJECT


def account_of(event: Event) -> object:
    """The connected account an event's object is in: a snapshot event's `account`, a thin event's context (the
    last account of its path, the one that owns the object); None: the platform's own."""
    if is_thin(event.document):
        context = event.document.get("context")
        return context.rsplit("/", 1)[-1] if isinstance(context, str) else None
    return event.document.get("account")
