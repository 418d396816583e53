"""``python -m components.evaluate``: the evaluation stage's command (``--help`` lists its options).

The stage's libraries (torch, transformers, lm-eval) load with the garbage collector paused
(common/startup.py): ``--help`` takes 4.1 s of CPU here against 6.4 s through
``python -m components.evaluate.stage``, which runs the same ``main`` (3 pairs of runs on a 2-core CI host).
"""

from common.startup import imports_without_collection

with imports_without_collection():
    from components.evaluate.stage import main

main()
