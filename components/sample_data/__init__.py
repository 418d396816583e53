"""The bundled practical-skills Q&A dataset, shipped inside the package and image, its preference pairs, and a
benchmark task of the same subject.

The dataset is the default one, so a pipeline run needs no data source configured. The preference pairs
(``practical_skills_preferences.jsonl``) are the same questions, each with its careful answer chosen over a
careless or unsafe one (six written per topic, taken in turn): the default data of objective dpo. The task
(``practical_skills_mc/``: an lm-eval task YAML beside its 40 multiple-choice questions) is what a local
run scores its models on, since the Hub's benchmarks cannot be downloaded there.
"""

from importlib import resources
from pathlib import Path

SAMPLE_FILE = "practical_skills.jsonl"
PREFERENCE_SAMPLE_FILE = "practical_skills_preferences.jsonl"
SAMPLE_TASK = "practical_skills_mc"


def bundled_dataset_path(objective: str = "sft") -> Path:
    """Absolute path of the bundled JSONL file of ``objective``'s kind: conversations, or preference pairs."""
    name = PREFERENCE_SAMPLE_FILE if objective == "dpo" else SAMPLE_FILE
    return Path(str(resources.files(__package__).joinpath(name)))


def bundled_task_dir() -> Path:
    """Absolute path of the bundled lm-eval task directory."""
    return Path(str(resources.files(__package__).joinpath(SAMPLE_TASK)))
