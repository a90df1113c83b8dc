"""razorpay.Client over the process's outbound calls; imported on the first call to Razorpay's API, so that
importing the service imports neither razorpay nor requests."""

from typing import TYPE_CHECKING, Any

import requests
from razorpay import Client  # type: ignore[import-untyped]  # no hints
from requests.adapters import BaseAdapter

from ...core.errors import ProviderUnavailableError
from ...core.vocabulary import InvalidJSONError, load
from ..outbound import MAX_ANSWER_BYTES, Deadline, Outbound, record
from .scheme import NAME, SCHEME

if TYPE_CHECKING:
    from ..budget import Spend


class NoRecordError(Exception):
    """Razorpay has no such entity."""


class Transport(BaseAdapter):
    """razorpay.Client's HTTP through the process's outbound calls (one deadline, the status read as every
    provider's): the client sees only a 200, whose bytes are kept."""

    def __init__(self, outbound: Outbound, deadline: Deadline, what: str, spend: "Spend | None",
                 max_bytes: int = MAX_ANSWER_BYTES) -> None:
        super().__init__()
        self.outbound, self.deadline, self.what, self.spend = outbound, deadline, what, spend
        self.max_bytes = max_bytes  # an entity's by default; a page of the audit's lists more
        self.body: bytes | None = None

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:
        headers = {name: value.decode() if isinstance(value, bytes) else value
                   for name, value in request.headers.items()}
        # The client's fetches are GETs, without a body; an answer in its bytes, not compressed.
        reply = self.outbound.request(SCHEME, "GET", request.url or "", self.deadline,
                                      headers={**headers, "Accept-Encoding": "identity"}, spend=self.spend,
                                      max_bytes=self.max_bytes)
        # Razorpay answers an id it does not know (or another account's) 400 BAD_REQUEST_ERROR.
        found = record(reply._replace(status=404) if reply.status == 400 else reply, NAME, self.what)
        if found is None:
            raise NoRecordError
        try:
            load(found)  # the client's own parse of a body that is not JSON prints to stdout
        except InvalidJSONError as exc:
            raise ProviderUnavailableError(f"Razorpay's API answered with an entity that does not parse: {exc}") \
                from None
        self.body = found
        response = requests.Response()
        response.status_code, response._content, response.url, response.request = 200, found, request.url or "", \
            request
        response.headers["Content-Type"] = "application/json"
        response.encoding = "utf-8"
        return response

    def close(self) -> None:
        pass  # each call its own connection, closed by outbound


def calling(outbound: Outbound, deadline: Deadline, what: str, spend: "Spend | None", auth: tuple[str, str],
            base: str, max_bytes: int = MAX_ANSWER_BYTES) -> tuple[Any, Transport]:
    """A razorpay.Client whose every request goes through outbound, and the Transport that keeps its answer's bytes."""
    transport = Transport(outbound, deadline, what, spend, max_bytes)
    session = requests.Session()
    session.trust_env = False  # no proxy or .netrc from the environment: the call is the outbound's alone
    session.mount("https://", transport)
    session.mount("http://", transport)
    return Client(session=session, auth=auth, base_url=base), transport
