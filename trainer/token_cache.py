"""The tokenised data set on shared storage: what identifies it, what it holds, and how ranks open it.

The tokenise step (``components.tokenise``) writes one directory per cache key
under ``<workspace>/token-cache/``; the training ranks and the evaluation stage
only read it. The key is a digest of everything that changes the tokens: the
Parquet splits' bytes (which already carry the data stage's system prompt and
field mapping), the tokenizer's files, its chat template, the settings below
and ``FORMAT_VERSION``. Change any of them and the key changes, so a directory
with a given key never needs to be checked for staleness, only for completeness:
``manifest.json`` is written last, inside a directory built under another name
and renamed into place whole.

The Arrow files are IPC streams that ``datasets.Dataset.from_file`` memory-maps:
a rank's process holds none of the rows, only the pages it touches, and all the
ranks of a node share one copy in the page cache.

    <key>/
      train.arrow               the rows the trainer trains on: input_ids, labels (-100 where no loss),
                                and seq_lengths when packed: the exact rows TRL's own preparation makes
      eval.arrow                the same for the (capped) eval conversations: the trainer's eval loss
      eval_conversations.arrow  the (capped) eval conversations one per row, untruncated, with
                                assistant_masks: the evaluation stage's held-out loss
      manifest.json             the key's inputs, row and token counts, sizes, timings; written last
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from common.atomic import write_json
from common.errors import UserError
from common.records import SourceTokens, nested_record_of, record_of
from common.run_layout import TOKENS_MANIFEST

if TYPE_CHECKING:  # every command that reads the run form's options imports this module for its constants
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

# Bump whenever what is written changes (columns, their meaning, how rows are prepared or packed).
FORMAT_VERSION = 1
# Files of a tokenizer directory that can change how text becomes tokens or how the template renders.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


# The TokenSettings that are training options too: the trainer refuses rows made with other values.
TRAINING_SETTINGS = ("max_length", "loss_on", "packing", "objective")


@dataclass(frozen=True)
class TokenSettings:
    """The training options that change the tokenised rows; each is part of the cache key."""

    max_length: int
    loss_on: str
    packing: bool
    eval_max_rows: int  # 0: every eval conversation
    objective: str = "sft"  # sft: conversation rows; dpo: preference pair rows (trainer.preference_rows)


def tokenizer_fingerprint(tokenizer_dir: Path, tokenizer: PreTrainedTokenizerBase) -> str:
    """Digest of the tokenizer's files and its chat template, as loaded (a template may come from any file)."""
    digest = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = tokenizer_dir / name
        if path.is_file():
            digest.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    digest.update(b"template\0" + (tokenizer.chat_template or "").encode())
    return digest.hexdigest()


def data_fingerprint(paths: list[Path]) -> str:
    """Digest of the Parquet splits' bytes, read in blocks (a large split is never held whole)."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as handle:
            while block := handle.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()


def cache_key(data: str, tokenizer: str, settings: TokenSettings, sources: tuple[tuple[str, int], ...] = ()) -> str:
    """The directory name for these inputs: short enough to read in a log, long enough never to collide.

    ``sources``: a mixture's sources (URI, training rows), which the entry's manifest counts tokens for; the
    Parquet bytes alone do not name them (a source moved to another bucket gives the same rows). Left out of the
    key when empty, so the key of one source's data is what it always was."""
    inputs = {"format": FORMAT_VERSION, "data": data, "tokenizer": tokenizer, **dataclasses.asdict(settings)}
    if sources:
        inputs["sources"] = [list(source) for source in sources]
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class SplitTokens:
    """What the tokenise step made of one split."""

    conversations: int  # tokenised (the eval split's: those kept under eval_max_rows)
    tokens: int
    loss_tokens: int  # the tokens with a label (assistant tokens under loss_on assistant), within max_length
    longest_conversation_tokens: int
    rows: int  # training rows: packed rows hold several conversations
    seconds: float
    conversations_per_second: float | None
    # The eval split only (None for train): the split's conversations, and the cap that kept some of them
    split_conversations: int | None = None
    eval_max_rows: int | None = None
    # Preference pairs only (None for conversations): those dropped for a prompt of max_length tokens or more
    prompts_too_long: int | None = None
    # The train split of a mixture only: each source's rows of it, in the data step's order (empty otherwise)
    sources: tuple[SourceTokens, ...] = ()


@dataclass(frozen=True)
class TokenManifest:
    """``<key>/manifest.json``: what one cache entry was made from and holds; written last, by the tokenise step.

    Read by the training ranks (the settings and the tokenizer their run must match, the conversations for the
    summary), the evaluation stage (how many eval conversations the held-out loss covers) and the tokenise step
    (its metrics, a reused entry). Its ``format`` is the rows' format, ``FORMAT_VERSION``, part of the cache key:
    a manifest of another format is refused before its fields are read.
    """

    format: int
    key: str
    data: str  # the Parquet splits' digest
    data_dir: str
    tokenizer: str  # the tokenizer's and chat template's digest
    tokenizer_dir: str
    settings: dict[str, Any]  # TokenSettings as JSON
    workers: int
    train: SplitTokens
    eval: SplitTokens
    bytes: int

    FIX: ClassVar[str] = (
        "Run the tokenise step again with this image: it writes a new cache entry (the one here can be deleted)."
    )

    def write(self, path: Path) -> None:
        write_json(path, dataclasses.asdict(self))

    @classmethod
    def read(cls, tokens_dir: Path) -> TokenManifest:
        """The manifest of a complete tokenised data set, or a clear error naming the step that writes one."""
        path = tokens_dir / TOKENS_MANIFEST
        if not path.is_file():
            raise UserError(
                f"{tokens_dir} holds no tokenised data set ({TOKENS_MANIFEST} is missing). --tokens-dir must be the "
                "directory the tokenise step printed (python -m components.tokenise.stage --data-dir DATA --model "
                "MODEL ...); a directory without a manifest was never completed and is never read."
            )
        value = json.loads(path.read_text())
        if not isinstance(value, dict) or value.get("format") != FORMAT_VERSION:
            found = value.get("format") if isinstance(value, dict) else None
            raise UserError(
                f"{tokens_dir} was written in tokenised format {found}, and this trainer reads format "
                f"{FORMAT_VERSION}; run the tokenise step again with this image (it writes a new cache entry)."
            )
        manifest = record_of(value, cls, path, "its token cache manifest", cls.FIX)
        return dataclasses.replace(
            manifest, train=_split(manifest.train, path, "train"), eval=_split(manifest.eval, path, "eval")
        )

    def check_matches(self, tokens_dir: Path, wanted: dict[str, Any], tokenizer: str) -> None:
        """Refuse a tokenised set made with other settings (those named in ``wanted``) or another tokenizer."""
        differ = [
            f"{name} {self.settings.get(name)!r} (this run: {value!r})"
            for name, value in wanted.items()
            if self.settings.get(name) != value
        ]
        if self.tokenizer != tokenizer:
            differ.append("another tokenizer or chat template than this run's model has")
        if differ:
            raise UserError(
                f"the tokenised data in {tokens_dir} was made with " + "; ".join(differ) + ". Run the tokenise step "
                "with this run's model and options (the pipeline does), and pass the directory it prints."
            )


def _split(value: Any, path: Path, name: str) -> SplitTokens:
    """One split's counts in a manifest, its sources as records too."""
    if value is None:
        raise UserError(f"{path}: its {name} split is null. {TokenManifest.FIX}")
    split = nested_record_of(value, SplitTokens, path, f"{name} split", TokenManifest.FIX)
    sources = SourceTokens.all_of(split.sources, path, f"{name} split's sources", TokenManifest.FIX)
    return dataclasses.replace(split, sources=sources)


def open_rows(tokens_dir: Path, name: str) -> Dataset:
    """One of the Arrow files, memory-mapped: no row is read until it is used."""
    from datasets import Dataset  # here, not above: see the TYPE_CHECKING import

    return Dataset.from_file(str(tokens_dir / name), in_memory=False)
