"""PayPal's decimal amounts to the ledger's minor units (app.intake.events.minor_units): exact, by each currency's
ISO 4217 exponent, never through a float. PayPal's Money object is {"currency_code": "USD", "value": "21.00"}
(https://developer.paypal.com/api/rest/reference/currency-codes/: JPY, HUF and TWD take no decimals)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.intake.events import MAX_CENTS, minor_units

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("value, currency, units", [
    ("21.00", "USD", 2100), ("21", "USD", 2100), ("0.01", "USD", 1), ("21.5", "usd", 2150), ("21.500", "USD", 2150),
    ("500", "JPY", 500), ("500.0", "JPY", 500),
    ("1.234", "KWD", 1234), ("1", "KWD", 1000), ("0.001", "BHD", 1),
    ("1.2345", "CLF", 12345), (".5", "USD", 50),
    ("92233720368547758.07", "USD", MAX_CENTS),
])
def test_a_decimal_amount_becomes_minor_units_exactly(value, currency, units):
    assert minor_units(value, currency) == units


@pytest.mark.parametrize("value, currency", [
    ("0.001", "USD"),  # a tenth of a cent
    ("1.5", "JPY"),  # yen have no decimals
    ("1.2345", "KWD"),
    ("92233720368547758.08", "USD"),  # beyond a BIGINT
    ("-1.00", "USD"), ("+1.00", "USD"), ("1,00", "USD"), ("1e2", "USD"), (" 1.00", "USD"), ("1.", "USD"),
    (".", "USD"), ("", "USD"), ("١.٠٠", "USD"), ("1" * 33, "USD"),
    (21.0, "USD"), (2100, "USD"), ("21.00", None),
])
def test_a_value_that_does_not_convert_exactly_is_refused(value, currency):
    assert minor_units(value, currency) is None


@given(cents=st.integers(min_value=0, max_value=10**15))
def test_every_two_decimal_string_round_trips(cents):
    assert minor_units(f"{cents // 100}.{cents % 100:02d}", "EUR") == cents
    assert minor_units(str(cents), "JPY") == cents
    assert minor_units(f"{cents // 1000}.{cents % 1000:03d}", "KWD") == cents
