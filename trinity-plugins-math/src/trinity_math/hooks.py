"""Hook implementations of trinity-plugins-math (entry point `trinity` → `trinity_math.hooks`).

Importing this module must stay light (no torch at import time): `trinity plugins` loads it.
"""
