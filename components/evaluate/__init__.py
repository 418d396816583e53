"""Base, published and fine-tuned model on the held-out split: loss, sample answers, a reference score, a report,
a gate.

One module per job; ``components.evaluate.stage`` runs them in order (``champion`` loads the published model).
"""
