"""config package."""
