"""``python -m trainer``: the entry point torchrun starts on every rank."""

from __future__ import annotations

import logging
import os
import sys

from common.errors import exit_on_user_error
from common.startup import imports_without_collection
from trainer import preflight
from trainer.config import parse_config
from trainer.distributed import exit_process
from trainer.unused_packages import keep_out_unused_packages


@exit_on_user_error
def main() -> int:
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(
        level=logging.WARNING,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # Our own progress and checkpoint lines on rank 0; libraries only when they warn.
    logging.getLogger("trainer").setLevel(logging.INFO if rank == 0 else logging.WARNING)
    config = parse_config()
    # Before transformers, PEFT and TRL load: an option this pod cannot honour costs torch's import, not theirs.
    topology = preflight.check(config)
    keep_out_unused_packages(config)
    with imports_without_collection():  # transformers, PEFT and TRL: 2.5 s less CPU a rank
        from trainer.train import run_checked

    return run_checked(config, topology)


if __name__ == "__main__":
    exit_process(main())  # a user error has exited already, with its paragraph
