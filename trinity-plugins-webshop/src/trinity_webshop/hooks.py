"""Hook implementations of trinity-plugins-webshop (entry point `trinity` → `trinity_webshop.hooks`).

Importing this module must stay light (no torch at import time): `trinity plugins` loads it.
"""
