"""Buffers: taskset readers (explorer input) and experience storage (trainer input)."""
