"""Serving: the OpenAI-compatible API, serve mode (with its feedback ledger) and the debug server."""
