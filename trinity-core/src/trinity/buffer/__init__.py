"""Buffers: taskset readers (explorer input) and experience storage (trainer input).

Entry points (see :mod:`trinity.buffer.factory`): ``get_buffer_writer(config)``,
``get_buffer_reader(config)``, ``get_taskset_reader(tasksets, buffer_config)``. Importing this
package is cheap: storages import SQLAlchemy, Ray or ``datasets`` only when used.
"""

from trinity.buffer.base import BufferExhausted, BufferReader, BufferWriter
from trinity.buffer.factory import get_buffer_reader, get_buffer_writer, get_taskset_reader

__all__ = [
    "BufferExhausted",
    "BufferReader",
    "BufferWriter",
    "get_buffer_reader",
    "get_buffer_writer",
    "get_taskset_reader",
]
