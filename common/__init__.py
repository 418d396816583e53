"""What every part of the product shares, and nothing else.

This package is the bottom layer: ``trainer`` and ``gguf_export`` build on it,
``components`` on those, ``pipelines`` on ``components``. It imports none of
them (``tests/test_layers.py`` fails on any upward import), so the training
pods and the GGUF converter can use it without loading the pipeline.
"""
