"""Tests of app/providers/, one module per provider module: its rules as tables of (event, expected effect)."""
