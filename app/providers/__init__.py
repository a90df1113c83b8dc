"""The registry: every provider (app/core/provider.py's interface) by its scheme, and the rules of all of them by
event type. A new provider is its own module or folder here, and one line in PROVIDERS."""

from ..core.provider import Provider
from ..core.vocabulary import Event, Fields, Rule
from . import generic, paypal, razorpay, stripe

PROVIDERS: dict[str, Provider] = {provider.scheme: provider for provider in (
    generic.HMAC_SHA256,
    stripe.PROVIDER,
    generic.STANDARD_WEBHOOKS,
    generic.GITHUB,
    razorpay.PROVIDER,
    paypal.PROVIDER,
)}
SCHEMES = tuple(PROVIDERS)


def of(scheme: str) -> Provider:
    """The provider of a scheme the settings accepted (one of SCHEMES)."""
    return PROVIDERS[scheme]


def _shared(event_type: str, owners: list[Provider]) -> Rule:
    """The rule of a type several providers send: read as the provider whose shape the body is in, with its
    statuses, and each field named as every provider names it (a 422's message)."""
    rules = [owner.rules[event_type] for owner in owners]
    fallback = next(owner for owner in owners if owner.owns is None)

    def owner_of(event: Event) -> Provider:
        return next((owner for owner in owners if owner.owns is not None and owner.owns(event.document)), fallback)

    labels = Fields(*(" or ".join(f"{label} ({owner.name})" for owner, label in zip(owners, column, strict=True))
                      if all(column) else column[0] for column in zip(*(rule.labels for rule in rules), strict=True)))
    shared = Rule(rules[0].kind, lambda event: owner_of(event).rules[event_type].read(event), labels)
    return shared._replace(refine=lambda event: shared._replace(statuses=owner_of(event).rules[event_type].statuses))


def _every_rule() -> dict[str, Rule]:
    """Keyed by type, not by scheme: a Stripe event relayed by another sender still applies."""
    owners: dict[str, list[Provider]] = {}
    for provider in PROVIDERS.values():
        for event_type in provider.rules:
            owners.setdefault(event_type, []).append(provider)
    return {event_type: providers[0].rules[event_type] if len(providers) == 1 else _shared(event_type, providers)
            for event_type, providers in owners.items()}


RULES = _every_rule()
