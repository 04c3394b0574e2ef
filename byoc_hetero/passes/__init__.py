"""Relax rewrites run before partitioning, one named pass per module (each says what it rewrites and why).

The ordered list of the pipeline's passes is kept by the pipeline driver; each module here exposes one
function ``IRModule -> IRModule``.
"""
