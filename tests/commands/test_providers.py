"""`flask reconcile` and `flask audit` of a source whose provider lacks what they ask (app/commands/cli.py,
audit_cli.py): refused in one line, in the words the registry's providers give (app/providers/__init__.py)."""

import pytest

from tests.helpers import sources_config

pytestmark = pytest.mark.core


@pytest.fixture
def config(config):
    """The default source hmac-sha256's, a razorpay one beside it with an API key."""
    return sources_config(config, {"razorpay": None}, WEBHOOK_RAZORPAY_API_KEY="rzp_test_1234567890abcd:secret")


@pytest.mark.parametrize("args, says", [
    (["reconcile", "razorpay"], "source 'razorpay' has the scheme razorpay: only a stripe source's events can be "
                                "listed"),
    (["reconcile", "default"], "source 'default' has the scheme hmac-sha256: only a stripe source's events can be "
                               "listed"),
    (["audit", "default"], "source 'default' has the scheme hmac-sha256: only a stripe, razorpay or paypal source's "
                           "money can be audited"),
    (["audit", "razorpay", "--payouts"], "--payouts: not for a Razorpay source"),
    (["audit", "razorpay", "--account", "acct_1Alpha", "--all-accounts"],
     "--account, --all-accounts: not for a Razorpay source"),
])
def test_what_a_provider_lacks_is_refused_in_one_line(app, db, args, says):
    result = app.test_cli_runner().invoke(args=args)
    assert result.exit_code == 2 and result.output.splitlines()[-1] == f"Error: {says}", result.output
    assert db.execute("SELECT count(*) FROM reconcile_runs").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM audit_runs").fetchone() == (0,)
