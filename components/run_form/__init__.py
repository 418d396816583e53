"""The run form: the pipeline's parameters, as the person starting a run fills them in.

Each run parameter is one field of a stage's options dataclass, declared with
``common.cli_options.run_option`` (default, type, help, run-form name) and
validated by that stage's ``option_problems``. Derived from them here:
``table`` (the list, in run-form order), ``checks`` (the first pipeline step's
checks, across stages), ``docs`` (the descriptions KFP shows and the reference
page) and ``command_line`` (``--param NAME=VALUE`` typed against the pipeline).
The literal Python signatures KFP reads are generated from the table by
``python -m pipelines.generate``.
"""
