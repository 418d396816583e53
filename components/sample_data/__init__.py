"""The bundled practical-skills Q&A dataset, shipped inside the package and image.

It is the default dataset, so a pipeline run needs no data source configured.
"""

from importlib import resources
from pathlib import Path

SAMPLE_FILE = "practical_skills.jsonl"


def bundled_dataset_path() -> Path:
    """Absolute path of the bundled JSONL file."""
    return Path(str(resources.files(__package__).joinpath(SAMPLE_FILE)))
