"""Example third-party Trinity plugin."""
