"""Operator tools run from the repository root (``python -m tools.<name>``); the Makefile calls them."""
