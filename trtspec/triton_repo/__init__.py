"""The Triton model repository: model definitions (protobuf configs + files), the writer, validation, and the Python
models' sources (``models/*/model.py``, package data). Importing this package imports neither torch nor tritonclient.
"""
