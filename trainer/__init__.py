"""What runs inside the training pods: ``torchrun ... python -m trainer``.

TRL SFT with PEFT LoRA over the Parquet the data stage wrote to the workspace,
resuming from checkpoints after a pod restart. Built in its own issue; the
package exists so the runtime image and the layout are fixed from the start.
"""
