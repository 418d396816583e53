"""The model card as the next run reads it: where a publish records its data and the publishes before it.

A publish writes the card (``components.publish.model_card``) with entries of its own in the metadata:
``data_fingerprint``, which the next scheduled run compares with its prepared data, ``data_sources``, each
source's lineage (``common.records.SourceLineage``), which that run compares too, and ``published_history``, one
entry per publish, which each publish extends. They are read back from the
card on the Hub or in a dry run's upload folder, by whoever asks what users have now.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.errors import UserError
from common.records import SourceLineage

CARD_NAME = "README.md"
FINGERPRINT_KEY = "data_fingerprint"
LINEAGE_KEY = "data_sources"
HISTORY_KEY = "published_history"


def read_fingerprint(card_text: str) -> str | None:
    """The data fingerprint recorded in a model card's metadata, if any."""
    return _metadata(card_text).get(FINGERPRINT_KEY)


def read_lineage(card_text: str) -> tuple[SourceLineage, ...]:
    """The sources' lineage a model card records; an entry that is not one (anyone who can push to the repository
    can edit the card) is left out, and a card from before lineage has none."""
    value = _metadata(card_text).get(LINEAGE_KEY)
    found = []
    for entry in value if isinstance(value, list) else []:
        try:
            found.append(SourceLineage.of(entry, Path(CARD_NAME), f"an entry of {LINEAGE_KEY}", ""))
        except (UserError, AttributeError, TypeError):
            continue
    return tuple(found)


def read_history(card_text: str) -> list[dict[str, Any]]:
    """The publishes a model card lists in its metadata, oldest first; empty for a card without them."""
    value = _metadata(card_text).get(HISTORY_KEY)
    return [dict(entry) for entry in value if isinstance(entry, dict)] if isinstance(value, list) else []


def _metadata(card_text: str) -> dict[str, Any]:
    """The card's metadata as the Hub reads it, a field it cannot parse left out."""
    from huggingface_hub import ModelCard  # here: CARD_NAME's readers (the run summary) need no Hub client

    return ModelCard(card_text, ignore_metadata_errors=True).data.to_dict()
