"""Assistant-only loss and packing on SmolLM2's real chat template, whose template has no generation markers."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import tokenised
from todays_path import tokenise_split
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTTrainer

from common.run_layout import EVAL_CONVERSATIONS, EVAL_ROWS, TRAIN_ROWS
from tests import masking_reference
from trainer import data
from trainer.config import TrainConfig
from trainer.distributed import Topology
from trainer.masking import TemplateError, tokenise_conversation, tokenise_conversations
from trainer.objectives.sft import sft_arguments
from trainer.token_cache import open_rows

CONVERSATION = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "For knots, which knot makes a fixed loop?"},
    {"role": "assistant", "content": "A bowline makes a fixed loop that will not slip."},
    {"role": "user", "content": "And to join two ropes?"},
    {"role": "assistant", "content": "Use a sheet bend."},
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_model_dir):
    """The tiny model's own: SmolLM2's tokenizer and chat template, cut to the tiny vocabulary (conftest)."""
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def masked_runs(input_ids, mask, tokenizer):
    """Decoded text of each contiguous run of tokens whose mask is 1."""
    runs, current = [], []
    for token, bit in zip(input_ids, mask):
        if bit:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    if current:
        runs.append(current)
    return [tokenizer.decode(run) for run in runs]


def test_only_each_reply_and_its_end_token_are_trained(tokenizer):
    """The loss must cover what the assistant says and the token that ends its turn (so it learns to stop),
    nothing else."""
    encoded = tokenise_conversation(tokenizer, CONVERSATION)
    assert masked_runs(encoded.input_ids, encoded.assistant_masks, tokenizer) == [
        "A bowline makes a fixed loop that will not slip.<|im_end|>",
        "Use a sheet bend.<|im_end|>",
    ]
    assert tokenizer.decode(encoded.input_ids) == tokenizer.apply_chat_template(CONVERSATION, tokenize=False)


def test_prompt_tokens_carry_no_loss_in_the_packed_rows(tiny_tokenizer, tiny_model_dir, prepared_data_dir, tmp_path):
    """In the rows the tokenise step packs, every labelled token is an assistant token and vice versa, and TRL's
    collator (which the trainer gets them through) keeps sequence boundaries out of the loss."""
    tokens_dir = tokenised(tiny_model_dir, prepared_data_dir, max_length=512)
    config = TrainConfig(model=str(tiny_model_dir), tokens_dir=tokens_dir, output_dir=tmp_path, max_length=512)
    split = tokenise_split(data.load_split(prepared_data_dir, "train"), tiny_tokenizer, "assistant")
    expected_labelled = sum(sum(row) for row in split["assistant_masks"])
    _, packed, _ = data.token_rows(config, tiny_model_dir, tiny_tokenizer)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        args=sft_arguments(config, Topology(rank=0, local_rank=0, world_size=1), has_eval=False),
        train_dataset=packed,
        processing_class=tiny_tokenizer,
    )
    assert len(packed) < len(split)  # conversations really were packed together
    labelled = [
        (token, label) for row in packed for token, label in zip(row["input_ids"], row["labels"]) if label != -100
    ]
    assert all(token == label for token, label in labelled)
    assert len(labelled) == expected_labelled
    text = tiny_tokenizer.decode([token for token, _ in labelled])
    assert "<|im_start|>" not in text and "For car maintenance," not in text and "assistant\n" not in text

    batch = trainer.data_collator([packed[0], packed[1]])
    assert "attention_mask" not in batch  # padding-free: sequence boundaries come from position_ids
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist()
    assert len(starts) == len(packed[0]["seq_lengths"]) + len(packed[1]["seq_lengths"]) >= 2
    assert all(batch["labels"][0, start] == -100 for start in starts)


# A template of another family (Llama 3's): a BOS, headers instead of ChatML, no newline after the end token.
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def varied_conversations(count: int) -> list[list[dict]]:
    """Single-turn and multi-turn, with and without a system turn, with text that tokenises awkwardly
    (non-ASCII, emoji, runs of spaces and newlines, trailing whitespace, an empty reply)."""
    rng = random.Random(7)
    phrases = ["A bowline.", "  two  spaces ", "naïve café ☕ 🎉", "line\n\nbreaks\n", "x" * 40, "", "Ünïcödé…"]
    conversations = []
    for index in range(count):
        turns = 1 if index % 2 else rng.randint(2, 6)
        messages = [{"role": "system", "content": rng.choice(phrases) or "Be brief."}] if index % 3 == 0 else []
        for _ in range(turns):
            messages.append({"role": "user", "content": rng.choice(phrases) or "Why?"})
            messages.append({"role": "assistant", "content": rng.choice(phrases)})
        conversations.append(messages)
    return [CONVERSATION, CONVERSATION[1:3], *conversations]


@pytest.mark.parametrize("template", ["smollm2", "llama3"])
def test_batched_tokenisation_gives_the_per_conversation_ids_and_masks(tokenizer, template):
    """The batched path (prefixes rendered in batches, one tokenizer call, masks in numpy) must train on exactly
    the tokens the per-conversation reference marks, for every kind of conversation and templates of both
    families, whether it is given many conversations or one."""
    if template == "llama3":
        tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
        tokenizer.chat_template = LLAMA3_TEMPLATE
    conversations = varied_conversations(60)
    reference = [masking_reference.tokenise_conversation(tokenizer, messages) for messages in conversations]
    assert tokenise_conversations(tokenizer, conversations) == reference
    assert [tokenise_conversation(tokenizer, messages) for messages in conversations] == reference
    assert any(sum(encoded.assistant_masks) for encoded in reference)  # the comparison covers trained tokens


@pytest.mark.parametrize("loss_on", ["assistant", "all"])
def test_the_tokenise_steps_rows_are_the_per_conversation_reference(
    tiny_tokenizer, tiny_model_dir, prepared_data_dir, loss_on
):
    """What the trainer gets from a split, conversation by conversation (unpacked, nothing truncated), with
    ``--loss-on`` either way; and the evaluation stage's eval conversations, whose masks it always needs."""
    tokens_dir = tokenised(tiny_model_dir, prepared_data_dir, max_length=4096, loss_on=loss_on, packing=False)
    for split, rows in (("train", TRAIN_ROWS), ("eval", EVAL_ROWS)):
        reference = [
            masking_reference.tokenise_conversation(tiny_tokenizer, messages)
            for messages in data.load_split(prepared_data_dir, split)["messages"]
        ]
        tokenised_rows = open_rows(tokens_dir, rows)
        assert tokenised_rows["input_ids"] == [encoded.input_ids for encoded in reference]
        assert tokenised_rows["labels"] == [
            [
                token if bit or loss_on == "all" else -100
                for token, bit in zip(encoded.input_ids, encoded.assistant_masks)
            ]
            for encoded in reference
        ]
    conversations = open_rows(tokens_dir, EVAL_CONVERSATIONS)
    assert conversations["assistant_masks"] == [encoded.assistant_masks for encoded in reference]


def test_template_that_rewrites_history_is_refused(tokenizer):
    """A template that renders earlier turns differently would put the loss on the wrong tokens: refuse it."""
    rewriting = (
        "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
        "<|im_start|>assistant\n[earlier]<|im_end|>\n"
        "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = rewriting
    with pytest.raises(TemplateError, match="--loss-on all"):
        tokenise_conversation(tokenizer, CONVERSATION)


def test_packed_conversations_do_not_attend_to_each_other(tiny_tokenizer, tiny_model_dir):
    """Packing is only correct when each conversation's logits equal those it gets alone.

    The forward pass is made as TRL's compute_loss makes it (``use_cache=False``): the
    model then derives a block-diagonal mask from the restarting position ids. With a
    KV cache the boundaries would be ignored, which is why the flag matters.
    """
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    first = tokenise_conversation(tiny_tokenizer, CONVERSATION[:3]).input_ids
    second = tokenise_conversation(tiny_tokenizer, CONVERSATION[1:3]).input_ids
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([ids]), use_cache=False).logits[0] for ids in (first, second)]
        packed = model(
            input_ids=torch.tensor([first + second]),
            position_ids=torch.tensor([list(range(len(first))) + list(range(len(second)))]),
            use_cache=False,
        ).logits[0]
    torch.testing.assert_close(packed[: len(first)], alone[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(packed[len(first) :], alone[1], atol=1e-4, rtol=1e-4)


def test_an_empty_eval_split_loads_as_zero_conversations(tmp_path):
    """eval_fraction 0 gives an eval.parquet with no rows; the trainer must then train without evaluating, not crash."""
    from components.data.options import PrepareOptions
    from components.data.prepare import prepare
    from components.sample_data import bundled_dataset_path

    prepare(str(bundled_dataset_path()), tmp_path, PrepareOptions(eval_fraction=0.0))
    assert len(data.load_split(tmp_path, "eval")) == 0
    assert len(data.load_split(tmp_path, "train")) == 324
