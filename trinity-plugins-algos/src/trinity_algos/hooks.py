"""Hook implementations of trinity-plugins-algos (entry point `trinity` → `trinity_algos.hooks`).

Importing this module must stay light (no torch at import time): `trinity plugins` loads it.
"""
