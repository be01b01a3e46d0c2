"""Rewrites of the Python pipeline before its proto is built: TestStreams in batch, Creates."""
