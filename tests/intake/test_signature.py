"""app/intake/signature.py: a pure module, checked against the providers' own libraries
and published test vectors, without a server."""

import base64
import hashlib
import hmac
from datetime import UTC, datetime

import pytest
import standardwebhooks
import stripe
from hypothesis import given, settings
from hypothesis import strategies as st

# paypal needs a certificate and a private key besides: tests/providers/paypal/test_scheme.py.
from app.intake.signature import HMAC_SCHEMES as SCHEMES
from app.intake.signature import SignatureError, sign, verify

# Starts no server: in `make check` (docs/testing.md).
pytestmark = pytest.mark.unit

BODY = b'{"id":"evt_1","type":"payment.succeeded","data":{}}'
NOT_UTF8 = b'{"id":"evt_1","note":"\xff\xfe caf\xe9"}'  # the providers' verifiers raise on these
NOW = 1_700_000_000
TOLERANCE = 300
KEY, OLD_KEY = b"the-current-key", b"the-retired-key"
STRIPE_SECRET = "whsec_stripe_test_secret"


def check(scheme, headers, secrets=(KEY,), body=BODY, now=NOW):
    return verify(scheme, body, headers, secrets, TOLERANCE, now=now)


def signed(scheme, body=BODY, keys=(KEY,), timestamp=NOW, msg_id="msg_1"):
    """Our own signer with this module's defaults: one signature per key where the scheme allows several."""
    return sign(scheme, body, keys, timestamp=timestamp, msg_id=msg_id)


# -- every scheme -------------------------------------------------------------

@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("body", [BODY, NOT_UTF8, b""], ids=["json", "not-utf8", "empty"])
def test_a_signature_over_the_raw_bytes_verifies(scheme, body):
    assert check(scheme, signed(scheme, body), body=body) == 0


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("body", [BODY, NOT_UTF8, b""], ids=["json", "not-utf8", "empty"])
def test_one_changed_byte_fails_the_signature(scheme, body):
    with pytest.raises(SignatureError, match="does not match"):
        check(scheme, signed(scheme, body), body=body + b" ")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rotation_any_configured_secret_verifies(scheme):
    for key in (OLD_KEY, KEY):
        check(scheme, signed(scheme, keys=(key,)), secrets=(KEY, OLD_KEY))  # raises if refused
    with pytest.raises(SignatureError, match="does not match"):
        check(scheme, signed(scheme, keys=(b"unknown",)), secrets=(KEY, OLD_KEY))


@pytest.mark.parametrize("scheme", SCHEMES)
def test_rotation_reports_the_index_of_the_secret_that_verified(scheme):
    assert check(scheme, signed(scheme, keys=(OLD_KEY,)), secrets=(KEY, OLD_KEY)) == 1
    assert check(scheme, signed(scheme, keys=(KEY,)), secrets=(KEY, OLD_KEY)) == 0


@pytest.mark.parametrize("scheme", ["stripe", "standard-webhooks"])
def test_rotation_both_signatures_in_one_header(scheme):
    headers = signed(scheme, keys=(OLD_KEY, KEY))
    assert check(scheme, headers, secrets=(KEY,)) == 0
    assert check(scheme, headers, secrets=(OLD_KEY,)) == 0
    assert check(scheme, headers, secrets=(b"unknown", KEY)) == 1


@pytest.mark.parametrize("scheme", ["stripe", "standard-webhooks"])
@pytest.mark.parametrize("offset, error", [
    (-TOLERANCE, None),
    (-TOLERANCE - 1, "too old"),
    (TOLERANCE, None),
    (TOLERANCE + 1, "too far in the future"),
    (-10**9, "too old"),
    (10**9, "too far in the future"),
])
def test_tolerance_is_enforced_both_ways_at_its_exact_boundary(scheme, offset, error):
    headers = signed(scheme, timestamp=NOW + offset)
    if error is None:
        assert check(scheme, headers) == 0
    else:
        with pytest.raises(SignatureError, match=error):
            check(scheme, headers)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_header_names_are_case_insensitive(scheme):
    headers = {name.upper(): value for name, value in signed(scheme).items()}
    assert check(scheme, headers) == 0


@pytest.mark.parametrize("scheme", SCHEMES)
def test_missing_headers_are_signature_errors(scheme):
    with pytest.raises(SignatureError, match="missing"):
        check(scheme, {})


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_missing_header_names_the_scheme_the_source_expects(scheme):
    with pytest.raises(SignatureError, match=f"^missing .* header: this source verifies the {scheme} scheme$"):
        check(scheme, {})


# Every pair of two schemes: the one a source verifies, and the one a delivery was signed by.
OTHER_SCHEME = pytest.mark.parametrize("expected, sent", [(expected, sent) for expected in SCHEMES for sent in SCHEMES
                                                          if sent != expected])


def _refused_for_another_scheme(expected, sent):
    """The headers signed under sent, and the message of their refusal by a source that verifies expected."""
    headers = signed(sent)
    with pytest.raises(SignatureError) as refused:
        check(expected, headers)
    return headers, str(refused.value)


@OTHER_SCHEME
def test_a_delivery_signed_by_another_scheme_is_told_which_it_carries(expected, sent):
    headers, message = _refused_for_another_scheme(expected, sent)
    unsigned = ("webhook-id", "webhook-timestamp", "x-razorpay-event-id")  # headers that carry no signature
    (header,) = [name for name in headers if name.lower() not in unsigned]
    assert message.startswith("missing "), message
    assert message.endswith(f"this source verifies the {expected} scheme, and the request carries {header}, "
                            f"the {sent} scheme's header"), message


@OTHER_SCHEME
def test_the_refusal_of_a_delivery_signed_by_another_scheme_quotes_no_header_value(expected, sent):
    headers, message = _refused_for_another_scheme(expected, sent)
    assert not [value for value in headers.values() if value in message], message


# -- hmac-sha256 ---------------------------------------------------------------

def test_hmac_sha256_is_hex_hmac_of_the_raw_bytes():
    assert sign("hmac-sha256", BODY, [b"k"]) == {"X-Signature": hmac.new(b"k", BODY, hashlib.sha256).hexdigest()}


@pytest.mark.parametrize("written", [str.upper, lambda header: f" {header} "], ids=["uppercase", "surrounding-spaces"])
def test_a_hmac_sha256_signature_written_loosely_verifies(written):
    header = written(sign("hmac-sha256", BODY, [KEY])["X-Signature"])
    assert check("hmac-sha256", {"X-Signature": header}) == 0


@pytest.mark.parametrize("header, message", [
    ("", "missing"),
    ("abc", "expected 64 hex digits"),
    ("g" * 64, "expected 64 hex digits"),
    ("é" * 64, "expected 64 hex digits"),
    ("0" * 64, "does not match"),
])
def test_hmac_sha256_bad_headers(header, message):
    with pytest.raises(SignatureError, match=message):
        check("hmac-sha256", {"X-Signature": header})


# -- stripe, against stripe-python --------------------------------------------

def test_header_made_by_stripe_python_verifies():
    header = stripe.WebhookSignature.generate_signature_header(BODY.decode(), STRIPE_SECRET, timestamp=NOW)
    assert check("stripe", {"Stripe-Signature": header}, secrets=(STRIPE_SECRET.encode(),)) == 0


def test_our_stripe_signer_matches_stripe_python_both_ways():
    ours = sign("stripe", BODY, [STRIPE_SECRET.encode()], timestamp=NOW)["Stripe-Signature"]
    assert ours == stripe.WebhookSignature.generate_signature_header(BODY.decode(), STRIPE_SECRET, timestamp=NOW)
    fresh = sign("stripe", BODY, [STRIPE_SECRET.encode()])["Stripe-Signature"]  # signed now
    assert stripe.WebhookSignature.verify_header(BODY, fresh, STRIPE_SECRET, tolerance=TOLERANCE)


def test_stripe_any_v1_may_match():
    good = signed("stripe")["Stripe-Signature"].split(",")[1]
    assert check("stripe", {"Stripe-Signature": f"t={NOW}, v1={'0' * 64}, {good}"}) == 0


@pytest.mark.parametrize("key", ["v0=not-hex", "scheme=x"], ids=["v0", "unknown"])
def test_stripe_ignores_the_keys_it_does_not_verify(key):
    good = signed("stripe")["Stripe-Signature"].split(",")[1]
    assert check("stripe", {"Stripe-Signature": f"t={NOW}, {key}, {good}"}) == 0


def test_stripe_timestamp_is_signed():
    v1 = signed("stripe")["Stripe-Signature"].split(",")[1]
    with pytest.raises(SignatureError, match="does not match"):
        check("stripe", {"Stripe-Signature": f"t={NOW + 1},{v1}"})


V1 = "v1=" + "a" * 64


@pytest.mark.parametrize("header, message", [
    (f"t={NOW}", "no v1 signature"),
    (f"t={NOW},v0={'a' * 64}", "no v1 signature"),
    (V1, "exactly one t="),
    (f"t={NOW},t={NOW},{V1}", "exactly one t="),
    (f"t=,{V1}", "in Unix seconds"),
    (f"t=+{NOW},{V1}", "in Unix seconds"),
    (f"t=-1,{V1}", "in Unix seconds"),
    (f"t={NOW}.5,{V1}", "in Unix seconds"),
    (f"t=1_700_000_000,{V1}", "in Unix seconds"),
    (f"t=١٧٠٠٠٠٠٠٠٠,{V1}", "in Unix seconds"),
    (f"t={'9' * 5000},{V1}", "in Unix seconds"),
    (f"t={NOW},v1=xyz", "expected 64 hex digits"),
    (f"t={NOW},v1", "key=value"),
    (f"t={NOW},,{V1}", "key=value"),
    ("garbage", "key=value"),
    ("\x00\xff", "key=value"),
])
def test_stripe_malformed_headers(header, message):
    with pytest.raises(SignatureError, match=message):
        check("stripe", {"Stripe-Signature": header})


# -- standard-webhooks, against the standardwebhooks package and the spec ------

# The specification's published test vector (also in its libraries' tests).
VECTOR_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
VECTOR_KEY = base64.b64decode("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
VECTOR = {"webhook-id": "msg_p5jXN8AQM9LWM0D4loKWxJek", "webhook-timestamp": "1614265330",
          "webhook-signature": "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}
VECTOR_BODY = b'{"test": 2432232314}'


def test_standard_webhooks_spec_vector_is_reproduced_by_our_signer():
    assert sign("standard-webhooks", VECTOR_BODY, [VECTOR_KEY], timestamp=1614265330,
                msg_id=VECTOR["webhook-id"]) == VECTOR


def test_standard_webhooks_spec_vector_verifies():
    assert verify("standard-webhooks", VECTOR_BODY, VECTOR, (VECTOR_KEY,), TOLERANCE, now=1614265330) == 0


def test_headers_made_by_the_standardwebhooks_package_verify():
    signed_at = datetime.fromtimestamp(NOW, tz=UTC)
    signature = standardwebhooks.Webhook(VECTOR_SECRET).sign("msg_lib", signed_at, BODY.decode())
    headers = {"webhook-id": "msg_lib", "webhook-timestamp": str(NOW), "webhook-signature": signature}
    assert check("standard-webhooks", headers, secrets=(VECTOR_KEY,)) == 0
    assert sign("standard-webhooks", BODY, [VECTOR_KEY], timestamp=NOW, msg_id="msg_lib") == headers


def test_our_standard_webhooks_signer_verifies_with_the_package():
    headers = sign("standard-webhooks", BODY, [VECTOR_KEY], msg_id="msg_ours")  # signed now
    assert standardwebhooks.Webhook(VECTOR_SECRET).verify(BODY, headers) == {
        "id": "evt_1", "type": "payment.succeeded", "data": {}}


def test_standard_webhooks_any_v1_may_match():
    headers = signed("standard-webhooks")
    wrong = "v1," + base64.b64encode(b"\0" * 32).decode()
    headers["webhook-signature"] = f"{wrong}  {headers['webhook-signature']}"
    assert check("standard-webhooks", headers) == 0


def test_standard_webhooks_unknown_versions_are_ignored():
    headers = signed("standard-webhooks")
    other = base64.b64encode(b"\0" * 32).decode()
    headers["webhook-signature"] = f"v1a,c2lnbmVk v2,{other} {headers['webhook-signature']}"
    assert check("standard-webhooks", headers) == 0


@pytest.mark.parametrize("name, value", [("webhook-id", "msg_2"), ("webhook-timestamp", str(NOW + 1))])
def test_standard_webhooks_id_and_timestamp_are_signed(name, value):
    headers = {**signed("standard-webhooks"), name: value}
    with pytest.raises(SignatureError, match="does not match"):
        check("standard-webhooks", headers)


GOOD_V1 = "v1," + base64.b64encode(b"\0" * 32).decode()


@pytest.mark.parametrize("name, value, message", [
    ("webhook-id", "", "missing webhook-id"),
    ("webhook-id", "m" * 256, "1 to 255 visible ASCII"),
    ("webhook-id", "msg 1", "1 to 255 visible ASCII"),
    ("webhook-id", "msg_é", "1 to 255 visible ASCII"),
    ("webhook-timestamp", "", "missing webhook-timestamp"),
    ("webhook-timestamp", "1e9", "in Unix seconds"),
    ("webhook-timestamp", "2024-01-01T00:00:00Z", "in Unix seconds"),
    ("webhook-signature", " ", "missing webhook-signature"),
    ("webhook-signature", "v1", "space-separated v1,<base64>"),
    ("webhook-signature", "unversioned-signature", "space-separated v1,<base64>"),
    ("webhook-signature", "v1,not-base64!", "base64 SHA-256 digest"),
    ("webhook-signature", "v1," + base64.b64encode(b"\0" * 31).decode(), "base64 SHA-256 digest"),
    ("webhook-signature", "v1a,c2lnbmVk", "no v1 signature"),
    ("webhook-signature", GOOD_V1 + ",extra", "base64 SHA-256 digest"),
])
def test_standard_webhooks_malformed_headers(name, value, message):
    headers = {**signed("standard-webhooks"), name: value}
    with pytest.raises(SignatureError, match=message):
        check("standard-webhooks", headers)


# -- github, against GitHub's documented example ------------------------------

# docs.github.com, "Validating webhook deliveries": the example secret, payload and header.
GITHUB_SECRET, GITHUB_BODY = b"It's a Secret to Everybody", b"Hello, World!"
GITHUB_HEADER = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def test_github_documented_example_is_reproduced_by_our_signer():
    assert sign("github", GITHUB_BODY, [GITHUB_SECRET]) == {"X-Hub-Signature-256": GITHUB_HEADER}


def test_github_documented_example_verifies():
    assert verify("github", GITHUB_BODY, {"X-Hub-Signature-256": GITHUB_HEADER}, (GITHUB_SECRET,), TOLERANCE) == 0


@pytest.mark.parametrize("header, message", [
    ("757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17", "expected sha256=<hex>"),
    ("sha1=0beec7b5ea3f0fdbc95d0dd47f3c5bc275da8a33", "expected sha256=<hex>"),
    ("SHA256=" + "a" * 64, "expected sha256=<hex>"),
    ("sha256=", "expected 64 hex digits"),
    ("sha256=" + "z" * 64, "expected 64 hex digits"),
    ("sha256=" + "0" * 64, "does not match"),
])
def test_github_malformed_headers(header, message):
    with pytest.raises(SignatureError, match=message):
        check("github", {"X-Hub-Signature-256": header})


# -- property-based: no header string and no body raises anything else ---------

any_text = st.text(st.characters(exclude_categories=()), max_size=120)  # lone surrogates too
timestamps = st.integers(NOW - 2 * TOLERANCE, NOW + 2 * TOLERANCE).map(str) | st.integers().map(str)
fragments = st.one_of(
    any_text, timestamps, st.binary(min_size=32, max_size=32).map(bytes.hex),
    st.binary(min_size=31, max_size=33).map(lambda b: base64.b64encode(b).decode()),
    st.sampled_from(["", " ", "=", ",", "t", "v1", "v0", "v1a", "sha256", "sha1", "\t", "\x00", "٣", "+1", "1_0",
                     "é", "\ud800"]),
)


def _items(keys, separators):
    return st.tuples(st.sampled_from(keys) | any_text, st.sampled_from(separators), fragments).map("".join)


HEADERS = {
    "hmac-sha256": {"X-Signature": fragments},
    "stripe": {"Stripe-Signature": st.lists(_items(["t", "v1", "v0", " t", "x"], ["=", "", "=="]), max_size=6)
               .map(",".join)},
    "standard-webhooks": {
        "webhook-id": fragments,
        "webhook-timestamp": timestamps | fragments,
        "webhook-signature": st.lists(_items(["v1", "v1a", "v2"], [",", "", ",,"]), max_size=6).map(" ".join),
    },
    "github": {"X-Hub-Signature-256": _items(["sha256", "sha1", "SHA256"], ["=", "", "=="])},
    "razorpay": {"X-Razorpay-Signature": fragments, "x-razorpay-event-id": fragments},
}
PROPERTY = settings(max_examples=400, deadline=None)


@pytest.mark.parametrize("scheme", SCHEMES)
@PROPERTY
@given(data=st.data(), body=st.binary(max_size=256))
def test_arbitrary_headers_and_bodies_raise_only_signature_error(scheme, data, body):
    headers = data.draw(st.fixed_dictionaries({}, optional={name: strategy | any_text
                                                            for name, strategy in HEADERS[scheme].items()}))
    with pytest.raises(SignatureError):
        check(scheme, headers, secrets=(KEY, OLD_KEY), body=body)


@pytest.mark.parametrize("scheme", SCHEMES)
@PROPERTY
@given(data=st.data(), body=st.binary(max_size=256))
def test_valid_headers_with_one_edit_verify_or_raise_only_signature_error(scheme, data, body):
    headers = signed(scheme, body)
    name = data.draw(st.sampled_from(sorted(headers)))
    value = headers[name]
    start = data.draw(st.integers(0, len(value)))
    end = data.draw(st.integers(start, len(value)))
    headers[name] = value[:start] + data.draw(fragments) + value[end:]
    try:
        assert check(scheme, headers, body=body) == 0
    except SignatureError:
        pass
