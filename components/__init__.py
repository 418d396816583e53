"""KFP components of the fine-tuning pipeline: one module per stage.

Each stage is plain, testable Python with a thin ``@dsl.component`` wrapper, so
the same code runs from a CLI, from tests and inside a pipeline pod.
"""
