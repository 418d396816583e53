"""The publish stage: one Hub commit holding the GGUF, Modelfile, reports and a model card.

Modules, in the order a run uses them: ``options`` (knobs and defaults), ``bundle`` (the upload folder, built
from the train/evaluate/export files), ``model_card`` (README.md), ``hub`` (the one commit, retried through
``components.champion.hub``), ``publish`` (the stage; ``stage`` is its CLI), ``changes`` and ``change_check``
(whether the data changed since the last published model). What was published before, and its records, are
``components.champion``'s.
"""
