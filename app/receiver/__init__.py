"""The HTTP surface: POST /api/webhooks and the probes, the fetch step, errors, logs and metrics."""
