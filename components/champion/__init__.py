"""The model users have now: the last publish of a repository (or of dry runs), and where its versions went.

Several steps ask about it: the data-change check (was it trained on this data?), the evaluation (the model to
beat), the publish step (did it change since the evaluation compared with it?), and store, register and serve
(which of them has this version done, and what are its files?); export and the local run's summary read the
version's files too. They all read it here, so none of them reaches into the publish or storage package for it
(tests/test_layers.py).

Modules: ``card`` (what a model card records for the next run: data fingerprint, publish history), ``hub``
(reading the Hub: retries and readable errors, shared with the publish step's commit), ``retries`` (their
settings, apart from the Hub client), ``record`` (the publish and delivery records on the workspace),
``published`` (where the last published model is: the Hub or the record), ``version`` (the version a run
publishes: its stage folders and what the stages left in them). Loading the published model to score it is the
evaluation's (``components.evaluate.champion``).
"""
