"""The pipeline's stages: one package per stage, plain and testable Python.

Each stage package holds its ``options`` (the run parameters it declares) and
its ``stage`` entry point (the CLI, and what the pipeline step calls);
``pipeline_steps`` wraps each in a thin ``@dsl.component``, so the same code
runs from a CLI, from tests and inside a pipeline pod. In pipeline order:
``data`` validates and splits the data, ``tokenise`` builds the token cache
every training rank memory-maps, ``train`` launches the trainer (a
PyTorchJob, a TrainJob or local torchrun), ``evaluate`` compares and gates,
``export`` writes and verifies GGUF files, ``publish`` uploads to the Hub and
decides whether the data changed, ``store`` copies the model to S3 and an OCI
registry, ``register`` records the version in the Model Registry and
``serve`` deploys it with KServe. A stage's package is named as its folder in
a run (``common.run_layout``) and its step; ``tokenise`` writes the token cache,
which runs share, instead of a run folder. ``champion`` is the model users have now,
which several of them read. ``run_form`` derives the pipeline's
parameters and first-step checks from the stages' options.
"""
