"""The data stage's Parquet splits as token ids with assistant masks, ready for TRL.

Tokenising here (instead of letting TRL render the chat template) is what makes
assistant-only loss work for templates without ``{% generation %}`` markers:
TRL turns the ``assistant_masks`` column into labels and then packs. With
``loss_on="all"`` the mask column is left out, so every token carries loss.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from common.errors import UserError
from trainer.masking import TemplateError, tokenise_conversations

SPLITS = ("train", "eval")


def split_path(data_dir: Path, split: str) -> Path:
    return data_dir / f"{split}.parquet"


def load_split(data_dir: Path, split: str) -> Dataset:
    """One split's ``messages`` column; a clear error when the data stage's output is not there."""
    path = split_path(data_dir, split)
    if not path.is_file():
        raise UserError(
            f"{path} does not exist. --data-dir must be the output directory of the data preparation stage "
            "(python -m components.dataprep.stage), which holds train.parquet and eval.parquet."
        )
    # Read with pyarrow: datasets' Parquet builder fails on a file with no rows,
    # which is what the data stage writes for eval when eval_fraction is 0.
    table = pq.read_table(path)
    if "messages" not in table.column_names:
        raise UserError(
            f"{path} has no 'messages' column (columns: {table.column_names}); re-run the data preparation stage."
        )
    return Dataset(table.select(["messages"]))


def tokenise(dataset: Dataset, tokenizer: PreTrainedTokenizerBase, loss_on: str) -> Dataset:
    """Token ids (and assistant masks unless ``loss_on == "all"``) for every conversation, a batch at a time."""

    def encode(batch: dict) -> dict:
        try:
            encoded = tokenise_conversations(tokenizer, batch["messages"])
        except TemplateError as error:
            raise UserError(str(error)) from None
        columns = {"input_ids": [conversation.input_ids for conversation in encoded]}
        if loss_on != "all":
            columns["assistant_masks"] = [conversation.assistant_masks for conversation in encoded]
        return columns

    return dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="Tokenising")
