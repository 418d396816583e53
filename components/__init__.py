"""The pipeline's stages: one package per stage, plain and testable Python.

Each stage package holds its ``options`` (the run parameters it declares) and
its ``stage`` entry point (CLI and what the pipeline step calls); ``steps``
wraps each in a thin ``@dsl.component``, so the same code runs from a CLI, from
tests and inside a pipeline pod. ``dataprep`` prepares, ``training`` launches
the trainer, ``evaluation`` compares and gates, ``export`` writes GGUF,
``publish`` uploads and decides whether the data changed.
"""
