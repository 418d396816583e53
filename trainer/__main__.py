"""``python -m trainer``: the entry point torchrun starts on every rank."""

from __future__ import annotations

import logging
import os
import sys

from common.errors import exit_on_user_error
from trainer.config import parse_config
from trainer.train import run


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
    return run(parse_config())


if __name__ == "__main__":
    sys.exit(main())
