"""Old home of the OpenAI-compatible server; it lives in :mod:`trinity.explorer.openai_api`.

Importing this module imports fastapi and uvicorn (as does starting a server).
"""

from __future__ import annotations

from trinity.explorer.openai_api.server import OpenAIServer, build_app

__all__ = ["OpenAIServer", "build_app"]
