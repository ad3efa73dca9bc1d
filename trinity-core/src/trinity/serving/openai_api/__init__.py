"""The OpenAI-compatible API in front of a :class:`~trinity.explorer.model_wrapper.ModelWrapper`.

- :mod:`.server`: the FastAPI app and :class:`~.server.OpenAIServer` (uvicorn in a thread);
  imports fastapi and uvicorn, so only import it when a server starts. Its routes live in
  :mod:`.chat` and :mod:`.completions`, on the pieces of :mod:`.replies` and :mod:`.streaming`
  (which import fastapi too).
- :mod:`.schema`: the request models (pydantic) and the OpenAI error shape.
- :mod:`.tool_parsers` and :mod:`.reasoning`: text -> tool calls / reasoning (pure Python).

This package's ``__init__`` imports nothing, so the parsers stay cheap to import.
"""
