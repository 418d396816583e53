"""The pipeline's stages as KFP components: each body is one call into its stage's plain Python.

``stages`` holds the hand-written components; ``train_step`` is generated from
the run form (``python -m pipelines.generate``) because its inputs are every
training run parameter. The modules they call must not define components
themselves: inside a pipeline pod ``kfp.dsl`` is the reduced runtime version,
which has no ``dsl.component``.
"""
