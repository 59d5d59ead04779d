"""Triton model repository: model definitions and the repository writer."""
