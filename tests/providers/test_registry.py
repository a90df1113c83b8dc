"""app/providers/__init__.py, the registry: every scheme's provider, and the rules of all of them merged by event
type (a type two providers send read as the provider whose shape the body is in)."""

import ast

import pytest

from app.intake import events
from app.intake.events import State, effect_of, parse
from app.providers import PROVIDERS, RULES, SCHEMES, of, razorpay, stripe
from devservers import ROOT
from tests.helpers import encode
from tests.providers.razorpay.events import refund_event as razorpay_refund
from tests.providers.stripe.events import refund as stripe_refund

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

SHARED = ("refund.created", "refund.failed")  # Stripe's names, and Razorpay's


def test_the_default_scheme_is_the_first_and_every_scheme_has_a_provider():
    assert SCHEMES[0] == "hmac-sha256"
    for scheme in SCHEMES:
        provider = of(scheme)
        assert provider.scheme == scheme
        assert provider.name and provider.signature_header
        assert (provider.sign is None) != (provider.sign_with_key is None), f"{scheme} signs one way"


def test_an_unknown_scheme_is_no_provider():
    with pytest.raises(KeyError):
        of("sha1")


def test_a_type_one_provider_sends_reads_by_its_rule():
    for provider in PROVIDERS.values():
        for event_type, rule in provider.rules.items():
            if event_type not in SHARED:
                assert RULES[event_type] is rule, f"{event_type} is not {provider.scheme}'s rule"
    assert set(RULES) == {event_type for provider in PROVIDERS.values() for event_type in provider.rules}


@pytest.mark.parametrize("event_type", SHARED)
def test_a_type_two_providers_send_names_both_in_its_labels(event_type):
    labels = RULES[event_type].labels
    assert "(Stripe) or " in labels.amount and "(Razorpay)" in labels.amount


def test_a_shared_type_reads_as_the_provider_whose_shape_the_body_is_in():
    body = encode(razorpay_refund("refund.failed", "rfnd_1", "pay_1", 500, "failed"))
    razorpays = parse(body, "razorpay", {"x-razorpay-event-id": "evt_r1"}, "razorpay")
    effect = effect_of(razorpays, events.Policy("inr"))
    assert (effect.payment_id, effect.movement_id, effect.state) == ("pay_1", "rfnd_1", State.REVERSED)
    assert events._rule_of(razorpays).statuses == razorpay.REFUND_STATES

    stripes = parse(str(stripe_refund("re_1", "pi_1", 500, status="failed")).encode(), "stripe")
    effect = effect_of(stripes, events.Policy("usd"))
    assert (effect.payment_id, effect.movement_id, effect.state) == ("pi_1", "re_1", State.REVERSED)
    assert events._rule_of(stripes).statuses == stripe.REFUND_STATES


def test_a_status_the_provider_does_not_send_is_refused_with_its_own_statuses():
    body = encode(razorpay_refund("refund.failed", "rfnd_1", "pay_1", 500, "succeeded"))
    effect = effect_of(parse(body, "razorpay", {"x-razorpay-event-id": "evt_r2"}, "razorpay"), events.Policy("inr"))
    assert effect.problem is not None and "processed" in effect.problem and "requires_action" not in effect.problem


def test_a_rule_compared_by_its_signed_body_is_read_when_fetched():
    thin = {event_type for event_type, rule in RULES.items() if rule.compared_by is not None}
    assert thin and all(event_type.startswith("v1.") for event_type in thin)
    assert all(events.read_when_fetched(event_type) for event_type in thin)
    assert not any(events.read_when_fetched(event_type) for event_type in set(RULES) - thin)


def _outside_providers():
    """app/'s modules that are no provider's, parsed."""
    app = ROOT / "app"
    return {path.relative_to(ROOT).as_posix(): ast.parse(path.read_text()) for path in sorted(app.rglob("*.py"))
            if not path.is_relative_to(app / "providers")}


def _names_a_provider(tree):
    """Where a module imports a provider's module or compares a scheme's name: (line, what)."""
    modules = {provider.verify.__module__.split(".")[2] for provider in PROVIDERS.values()}  # stripe, generic, ...
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and "providers" in node.module.split("."):
            parts = node.module.split(".")
            below = parts[parts.index("providers") + 1:]
            if below[:1] and below[0] in modules or not below and {alias.name for alias in node.names} & modules:
                found.append((node.lineno, f"imports {node.module}"))
        if isinstance(node, ast.Compare) and any(isinstance(side, ast.Constant) and side.value in SCHEMES
                                                 for side in (node.left, *node.comparators)):
            found.append((node.lineno, "compares a scheme's name"))
    return found


def test_no_module_outside_the_providers_names_one():
    named = {path: found for path, tree in _outside_providers().items() if (found := _names_a_provider(tree))}
    assert named == {}


def test_the_check_finds_a_module_that_names_a_provider():
    """The check above can fail."""
    tree = ast.parse("from ..providers import of, stripe\nfrom ..providers.paypal.api import API\n"
                     "from ..providers.budget import Budget\nif source.scheme == 'razorpay': pass\n")
    assert _names_a_provider(tree) == [(1, "imports providers"), (2, "imports providers.paypal.api"),
                                       (4, "compares a scheme's name")]
