"""What runs inside the training pods: ``torchrun ... -m trainer``.

TRL SFT with PEFT LoRA over the Parquet the data stage wrote to the workspace,
resuming from the newest complete checkpoint after a pod restart. The path from
options to result is ``config`` → ``preflight.check`` → ``train.run_checked``; the other modules each hold
one concern (masking, data, checkpoints, callbacks, diagnostics, outputs).
"""
