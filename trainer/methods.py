"""What each fine-tuning method implies, in one table.

``method`` chooses which weights train and how the frozen ones are held (lora, full, qlora). The trainer, the
fit check, the reports and the run form ask the method's entry here what it implies instead of testing its name,
so a new method is one entry, and what it changes shows in the places that read the flag it sets.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """One fine-tuning method and what it implies for every stage."""

    name: str
    # LoRA adapters train on a frozen base: the run writes adapter/ and merges it into merged/ at the end.
    trains_adapter: bool
    # The frozen base's linear weights are held in 4-bit NF4 by bitsandbytes (and merged into the unquantised base).
    quantised_base: bool
    # The peak learning rate when none is given: LoRA's usual 2e-4 (the LoRA and QLoRA papers, TRL's PEFT examples)
    # is about ten times what full fine-tuning uses (TRL SFTConfig's own default, torchtune's full fine-tuning
    # recipes: 2e-5); updating every weight at a LoRA rate destroys what the model knew.
    learning_rate: float
    # gradient_checkpointing auto turns it on. QLoRA is chosen to save memory; its paper and TRL's and Answer.AI's
    # QLoRA recipes all train with gradient checkpointing on.
    checkpointing_by_default: bool


LORA = Method("lora", trains_adapter=True, quantised_base=False, learning_rate=2e-4, checkpointing_by_default=False)
FULL = Method("full", trains_adapter=False, quantised_base=False, learning_rate=2e-5, checkpointing_by_default=False)
QLORA = Method("qlora", trains_adapter=True, quantised_base=True, learning_rate=2e-4, checkpointing_by_default=True)

# By name, in the order the run form offers them (the first is the default).
METHODS: dict[str, Method] = {method.name: method for method in (LORA, FULL, QLORA)}


def method_named(name: str) -> Method:
    """The method called ``name``; the options' choices have refused any other before anything asks."""
    return METHODS[name]
