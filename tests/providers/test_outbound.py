"""app/providers/outbound.py: a call to a provider's API ends by its deadline whatever the host does (drip, hang),
and a process makes at most its slots' worth of calls at once, the next one refused at once. Against
devservers.paypal_stand_in.py on loopback; no database."""

import threading
import time

import pytest

from app.core.errors import DeadlinePassedError, ProviderUnavailableError
from app.providers.outbound import Outbound
from devservers.paypal_stand_in import TOKEN_PATH

pytestmark = pytest.mark.core


def _token(outbound, paypal_api):
    """One call: POST the token request; its Reply."""
    with outbound.slot("paypal"):
        return outbound.request("paypal", "POST", paypal_api.url + TOKEN_PATH, outbound.deadline(),
                                body=b"grant_type=client_credentials")


def test_an_answer_within_the_deadline_is_returned_as_it_came(paypal_api):
    reply = _token(Outbound(1, 2.0), paypal_api)
    assert reply.status == 401 and b"invalid_client" in reply.body  # no credentials sent: PayPal's 401


@pytest.mark.parametrize("fault", ["drip", "hang", "delay"])
def test_a_host_that_drips_hangs_or_is_slow_is_cut_at_the_deadline(paypal_api, fault):
    """drip: a byte every 0.1 s, so each read returns well within any per-read timeout; the answer would take
    about 10 s. The call ends at its deadline all the same."""
    if fault == "drip":
        paypal_api.drip = 0.1
    elif fault == "hang":
        paypal_api.hang = True
    else:
        paypal_api.delay = 5.0
    started = time.monotonic()
    with pytest.raises(DeadlinePassedError, match="no answer within 0.5 s"):
        _token(Outbound(1, 0.5), paypal_api)
    # The deadline, with a second of room for a loaded machine: uncut, the drip takes 10 s and the delay 5 s.
    assert 0.4 < time.monotonic() - started < 1.5


def test_a_host_that_refuses_connections_is_unavailable_not_an_error(paypal_api):
    outbound = Outbound(1, 1.0)
    with outbound.slot("paypal"), pytest.raises(ProviderUnavailableError, match="unreachable"):
        outbound.request("paypal", "GET", "http://127.0.0.1:1/v1/oauth2/token", outbound.deadline())


def test_a_call_past_its_slots_is_refused_at_once(paypal_api):
    outbound = Outbound(1, 3.0)
    paypal_api.hang = True
    holder = threading.Thread(target=lambda: pytest.raises(DeadlinePassedError, _token, outbound, paypal_api))
    holder.start()
    while not paypal_api.requests:
        time.sleep(0.01)
    started = time.monotonic()
    with pytest.raises(ProviderUnavailableError, match="all 1 calls to providers are in flight"):
        _token(outbound, paypal_api)
    assert time.monotonic() - started < 1.0  # at once: waiting for the slot would take the 3 s deadline
    paypal_api.reset()  # lets the held answer go
    holder.join()


def test_a_slot_is_given_back_however_its_call_ended(paypal_api):
    outbound = Outbound(1, 0.3)
    paypal_api.hang = True
    with pytest.raises(DeadlinePassedError):
        _token(outbound, paypal_api)
    paypal_api.reset()
    assert _token(outbound, paypal_api).status == 401  # the one slot is free again


def test_each_call_is_told_to_the_observer_with_its_result(paypal_api):
    seen = []
    outbound = Outbound(1, 0.3, lambda provider, result, seconds: seen.append((provider, result)))
    _token(outbound, paypal_api)
    paypal_api.hang = True
    with pytest.raises(DeadlinePassedError):
        _token(outbound, paypal_api)
    assert seen == [("paypal", "401"), ("paypal", "timeout")]
