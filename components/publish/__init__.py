"""The publish stage: one Hub commit holding the GGUF, Modelfile, reports and a model card.

Modules, in the order a run uses them: ``options`` (knobs and defaults),
``bundle`` (the upload folder, built from the train/evaluate/export files),
``model_card`` (README.md), ``hub`` (the Hub calls, retries and errors),
``record`` (the fingerprint record on the workspace), ``published`` (where the
last published model is: the Hub or the record), ``publish`` (the stage),
``changes`` (whether the data changed since the last published model).
"""
