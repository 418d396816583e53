"""The bundled practical-skills Q&A dataset, shipped inside the package and image, and a benchmark task of the
same subject.

The dataset is the default one, so a pipeline run needs no data source configured. The task
(``practical_skills_mc/``: an lm-eval task YAML beside its 40 multiple-choice questions) is what a local
run scores its models on, since the Hub's benchmarks cannot be downloaded there.
"""

from importlib import resources
from pathlib import Path

SAMPLE_FILE = "practical_skills.jsonl"
SAMPLE_TASK = "practical_skills_mc"


def bundled_dataset_path() -> Path:
    """Absolute path of the bundled JSONL file."""
    return Path(str(resources.files(__package__).joinpath(SAMPLE_FILE)))


def bundled_task_dir() -> Path:
    """Absolute path of the bundled lm-eval task directory."""
    return Path(str(resources.files(__package__).joinpath(SAMPLE_TASK)))
