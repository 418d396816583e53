"""What the trainer and the stages read: the data stage's Parquet splits, and the tokenise step's rows.

The ranks never tokenise: they memory-map the rows the tokenise step wrote
(``trainer.token_cache``), after checking that those were made for this run.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
from datasets import Dataset
from transformers import PreTrainedTokenizerBase

from common.errors import UserError
from common.records import DataStats, SourceLineage
from common.run_layout import DATA_STATS, EVAL_ROWS, TRAIN_ROWS
from trainer import token_cache
from trainer.config import TrainConfig
from trainer.token_cache import TokenManifest

SPLITS = ("train", "eval")


def split_path(data_dir: Path, split: str) -> Path:
    return data_dir / f"{split}.parquet"


def load_split(data_dir: Path, split: str) -> Dataset:
    """One split's ``messages`` column, or a preference split's ``prompt``, ``chosen`` and ``rejected``; a clear
    error when the data stage's output is not there."""
    path = split_path(data_dir, split)
    if not path.is_file():
        raise UserError(
            f"{path} does not exist. --data-dir must be the output directory of the data preparation stage "
            "(python -m components.data.stage), which holds train.parquet and eval.parquet."
        )
    # Read with pyarrow: datasets' Parquet builder fails on a file with no rows,
    # which is what the data stage writes for eval when eval_fraction is 0.
    table = pq.read_table(path)
    for columns in (["messages"], ["prompt", "chosen", "rejected"]):  # conversations (sft), preference pairs (dpo)
        if set(columns) <= set(table.column_names):
            return Dataset(table.select(columns))
    raise UserError(
        f"{path} has neither a 'messages' column nor 'prompt', 'chosen' and 'rejected' columns (columns: "
        f"{table.column_names}); re-run the data preparation stage."
    )


def token_rows(
    config: TrainConfig, model_dir: Path, tokenizer: PreTrainedTokenizerBase
) -> tuple[TokenManifest, Dataset, Dataset]:
    """The tokenise step's manifest and its train and eval rows, memory-mapped, once they are known to be this
    run's: made with its max_length, loss_on and packing, and its model's tokenizer."""
    manifest = TokenManifest.read(config.tokens_dir)
    wanted = {name: getattr(config, name) for name in token_cache.TRAINING_SETTINGS}
    manifest.check_matches(config.tokens_dir, wanted, token_cache.tokenizer_fingerprint(model_dir, tokenizer))
    train = token_cache.open_rows(config.tokens_dir, TRAIN_ROWS)
    if not len(train):
        raise UserError(
            f"{config.tokens_dir} holds no training rows: none of the {manifest.train.conversations} train "
            f"conversations has an assistant token within its first {config.max_length} tokens. Raise max_length, "
            "or shorten the system and user turns."
        )
    return manifest, train, token_cache.open_rows(config.tokens_dir, EVAL_ROWS)


def data_sources(manifest: TokenManifest) -> tuple[SourceLineage, ...] | None:
    """The lineage of the sources the tokens were made from, as the data step recorded it beside the splits
    (``stats.json`` in the manifest's data directory); None when that file is gone (a cache entry kept after its
    run's data directory was deleted): the summary then names no source rather than a guess."""
    try:
        stats = DataStats.read(Path(manifest.data_dir) / DATA_STATS)
    except UserError:
        return None
    return stats.lineage if stats else None
