"""sync package."""
