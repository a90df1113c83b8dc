"""app/signature.py: a pure module, tested without a server."""

import hashlib
import hmac

import pytest

from app.signature import SignatureError, generate_signature, verify

BODY = b'{"id":"evt_1","type":"payment.succeeded","data":{}}'


def test_generated_signature_is_hex_hmac_sha256_of_the_raw_bytes():
    assert generate_signature(BODY, b"k") == hmac.new(b"k", BODY, hashlib.sha256).hexdigest()


def test_verify_returns_the_index_of_the_matching_secret():
    secrets = (b"old", b"new")
    assert verify(BODY, generate_signature(BODY, b"old"), secrets) == 0
    assert verify(BODY, generate_signature(BODY, b"new"), secrets) == 1


def test_uppercase_hex_and_surrounding_spaces_verify():
    assert verify(BODY, " " + generate_signature(BODY, b"k").upper() + " ", (b"k",)) == 0


@pytest.mark.parametrize("header, message", [
    (None, "missing"),
    ("", "missing"),
    ("abc", "expected 64 hex digits"),
    ("g" * 64, "not hexadecimal"),
    ("0" * 64, "does not match"),
])
def test_bad_headers_raise_one_exception_type(header, message):
    with pytest.raises(SignatureError, match=message):
        verify(BODY, header, (b"k",))


def test_one_changed_byte_fails():
    header = generate_signature(BODY, b"k")
    with pytest.raises(SignatureError):
        verify(BODY.replace(b"evt_1", b"evt_2"), header, (b"k",))
