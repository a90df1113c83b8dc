"""app/receiver/openapi.json: served as kept in the repository, and obeyed by the real
server, which schemathesis probes with generated requests that the test signs."""

import json

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.intake.signature import sign
from app.receiver.openapi import DOCUMENT_PATH
from tests.helpers import SECRET

pytestmark = pytest.mark.core

# "No 5xx, and no answer the document does not describe."
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


def test_document_is_served_as_kept_in_the_repository(client):
    response = client.get("/openapi.json")
    assert response.status_code == 200
    assert response.json == json.loads(DOCUMENT_PATH.read_text())
    assert response.json["openapi"].startswith("3.1.")
    assert set(response.json["paths"]) == {"/api/webhooks", "/api/webhooks/{source}", "/health", "/ready", "/metrics",
                                         "/openapi.json"}


def test_a_database_not_at_this_release_gets_the_documented_readiness(client, db):
    # The generated requests below meet a ready database: this 503 is checked against the document here.
    db.execute("DELETE FROM schema_migrations WHERE name = 'money.sql'")
    response = client.get("/ready")
    document = json.loads(DOCUMENT_PATH.read_text())
    answer = document["paths"]["/ready"]["get"]["responses"][str(response.status_code)]
    assert response.status_code == 503
    assert set(answer["headers"]) <= set(response.headers.keys())  # Retry-After among them
    readiness = document["components"]["schemas"]["Readiness"]
    assert set(readiness["required"]) <= set(response.json) <= set(readiness["properties"])
    for name, value in response.json.items():
        assert value in readiness["properties"][name].get("enum", [value]), name
    assert response.json["postgres"] == "not_at_this_release"
    assert response.json["postgres_reason"] == "the money rule (money.sql) is not applied: run `flask init-db`"


def signed(kwargs):
    """Serialise the generated body ourselves and sign those exact bytes, as a provider does."""
    headers = kwargs["headers"]
    if "json" in kwargs:
        kwargs["data"] = json.dumps(kwargs.pop("json")).encode()
    if isinstance(kwargs.get("data"), str):
        kwargs["data"] = kwargs["data"].encode()
    if isinstance(kwargs.get("data"), bytes):
        headers.update(sign("hmac-sha256", kwargs["data"], [SECRET.encode()]))
    return kwargs


@pytest.mark.parametrize("mode", [schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])
def test_generated_requests_get_only_documented_answers(gunicorn, db, mode):
    # The document's example source is served too, with the default source's
    # scheme and secret: the examples that name it get every answer, not only 404.
    # Sharing a secret, it must share the default source's events (MOVED_FROM).
    server = gunicorn(workers=1, threads=4, WEBHOOK_SOURCES="billing", WEBHOOK_BILLING_SECRET=SECRET,
                      WEBHOOK_BILLING_MOVED_FROM="default")
    schema = schemathesis.openapi.from_url(f"{server.base}/openapi.json")
    session = requests.Session()

    def conforms(case):
        kwargs = signed(case.as_transport_kwargs(base_url=server.base))
        response = session.request(**kwargs, timeout=10)
        case.validate_response(response, checks=CHECKS, headers=kwargs["headers"], transport_kwargs=kwargs)

    for operation in (result.ok() for result in schema.get_all_operations()):
        # The deliveries get most of the examples. The GETs take nothing but an
        # optional free-form header, so nothing can be made invalid for them.
        if operation.method != "post" and mode == schemathesis.GenerationMode.NEGATIVE:
            continue
        examples = 150 if operation.method == "post" else 10
        run = settings(max_examples=examples, deadline=None, database=None,
                       suppress_health_check=list(HealthCheck))(given(case=operation.as_strategy(mode))(conforms))
        run()
    session.close()  # an open keep-alive connection would hold up gunicorn's shutdown
