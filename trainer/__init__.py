"""What runs inside the training pods: ``torchrun ... -m trainer``.

TRL SFT (full, LoRA or QLoRA with PEFT) over the token cache the tokenise step
wrote to the workspace, memory-mapped by every rank, resuming from the newest
complete checkpoint after a pod restart. The path from
options to result is ``config`` → ``preflight.check`` → ``train.run_checked``; the other modules each hold
one concern (masking, data, checkpoints, callbacks, diagnostics, outputs).
"""
