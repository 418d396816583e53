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
from trainer.masking import TemplateError, tokenise_conversation

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
    """Token ids (and assistant masks unless ``loss_on == "all"``) for every conversation."""

    def encode(example: dict) -> dict:
        try:
            encoded = tokenise_conversation(tokenizer, example["messages"])
        except TemplateError as error:
            raise UserError(str(error)) from None
        if loss_on == "all":
            return {"input_ids": encoded.input_ids}
        return {"input_ids": encoded.input_ids, "assistant_masks": encoded.assistant_masks}

    return dataset.map(encode, remove_columns=dataset.column_names, desc="Tokenising")
