"""trainer/preference_rows.py: the token rows of preference pairs are exactly what TRL's DPOTrainer makes."""

from __future__ import annotations

from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import DPOConfig, DPOTrainer

from trainer.preference_rows import PAIR_COLUMNS, tokenise_pairs


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


PAIRS = [
    ([user("How long do I boil an egg?")], [assistant("Nine minutes.")], [assistant("Whatever.")]),
    (
        [{"role": "system", "content": "Be brief."}, user("I have eggs."), assistant("Good."), user("Boil one?")],
        [assistant("Nine minutes, then cold water.")],
        [assistant("No.")],
    ),
]


def test_the_rows_are_those_trl_s_own_preparation_makes(tiny_model_dir, tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts, chosen, rejected = (list(column) for column in zip(*PAIRS))
    rows, dropped = tokenise_pairs(tokenizer, prompts, chosen, rejected, max_length=1024)
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=DPOConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_length=1024),
        train_dataset=Dataset.from_dict({"prompt": prompts, "chosen": chosen, "rejected": rejected}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"),
    )
    assert dropped == []
    assert {name: trainer.train_dataset[name] for name in PAIR_COLUMNS} == rows


def test_a_pair_whose_prompt_fills_max_length_is_dropped_and_counted(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts, chosen, rejected = (list(column) for column in zip(*PAIRS))
    lengths = [len(ids) for ids in tokenise_pairs(tokenizer, prompts, chosen, rejected, 1024)[0]["prompt_ids"]]
    assert lengths[0] != lengths[1]
    rows, dropped = tokenise_pairs(tokenizer, prompts, chosen, rejected, max_length=min(lengths) + 1)
    assert dropped == [lengths.index(max(lengths))] and [len(ids) for ids in rows["prompt_ids"]] == [min(lengths)]
