"""The release: setup.cfg, the image's label, openapi.json, CHANGELOG.md and /health say it too."""

__version__ = "1.0.0"
