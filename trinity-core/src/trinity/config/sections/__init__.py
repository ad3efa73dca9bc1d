"""The pydantic models of each configuration section (one module per area)."""
