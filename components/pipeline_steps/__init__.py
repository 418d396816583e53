"""The pipeline's stages as KFP components: each body is one call into its stage's plain Python.

``stages`` and ``train_step`` are generated (``python -m pipelines.generate``)
from ``pipelines/step_signatures.py``, which declares what each step takes;
``skipped`` holds the one component that is not a stage. The modules they call
must not define components themselves: inside a pipeline pod ``kfp.dsl`` is the reduced runtime version,
which has no ``dsl.component``.
"""
