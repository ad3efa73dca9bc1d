"""The data processor: operators (component kind ``operator``) and the pipelines that run them
on task rows before exploring and on experiences between the explorer and the buffer.

Imports nothing heavy: the pipelines and built-in operators are imported where they are used.
"""
