"""Relax and ONNX rewrites of the pipeline, one module each (what each rewrites and why in its docstring)."""
