"""Keep bitsandbytes out of the ranks that do not quantise.

PEFT imports bitsandbytes whenever it is installed (``peft.helpers``), whatever the run: that costs every rank of a
LoRA or full fine-tuning run 1.3-2 s of CPU at start-up (measured with ``import trainer.train`` on a 2-core CI
host) and, on CPUs, prints bitsandbytes' warning about a missing ``kernels`` package into every rank's log. Only
a method with a quantised base (``method qlora``) uses it. A ``None`` in ``sys.modules`` is Python's own mark for a
module that must not be imported: ``import`` raises ImportError and ``importlib.util.find_spec`` returns None,
which is how PEFT, transformers and accelerate ask whether it is there.
"""

from __future__ import annotations

import sys

from trainer.config import TrainConfig


def keep_out_unused_packages(config: TrainConfig) -> None:
    """Before transformers, PEFT and TRL load: a run that does not quantise never imports bitsandbytes."""
    if not config.training_method.quantised_base and "bitsandbytes" not in sys.modules:
        sys.modules["bitsandbytes"] = None
