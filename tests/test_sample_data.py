"""The bundled practical-skills dataset: the default input of every pipeline run.

A run with no dataset configured trains on this file, so it must be well formed,
balanced across its topics, clean enough to pass the data stage untouched, and
actually shipped inside the installed package.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from importlib import resources

import pytest
from conftest import REPO_ROOT, all_rows, read_rejects

from common.records import DataStats
from components.data.options import PrepareOptions
from components.data.prepare import prepare
from components.data.stage import locate_dataset_uri
from components.sample_data import SAMPLE_FILE, bundled_dataset_path

TOPICS = {
    "car maintenance",
    "home repair",
    "computer troubleshooting",
    "first aid",
    "wilderness survival",
    "knots",
    "signalling",
    "cooking measurements",
    "photography",
}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    lines = bundled_dataset_path().read_text(encoding="utf-8").splitlines()
    assert all(line.strip() for line in lines), "blank line in the bundled dataset"
    return [json.loads(line) for line in lines]


def test_bundled_path_is_an_existing_absolute_file():
    """The pipeline passes this path to the data stage as is, from any working directory."""
    path = bundled_dataset_path()
    assert path.is_absolute() and path.is_file()
    assert path.name == SAMPLE_FILE
    assert locate_dataset_uri("").input == locate_dataset_uri("   ").input == str(path)


def test_has_at_least_300_records(records):
    """Fewer would leave too little for a meaningful train/eval split at the default 10%."""
    assert len(records) >= 300


def test_every_record_is_exactly_topic_question_answer_strings(records):
    """One uniform shape, no stray fields, no blanks: the model sees consistent 'For <topic>, <question>' prompts."""
    for number, record in enumerate(records, 1):
        assert isinstance(record, dict), number
        assert set(record) == {"topic", "question", "answer"}, number
        for key, value in record.items():
            assert isinstance(value, str) and value.strip() == value and value, (number, key)


def test_covers_exactly_the_nine_topics_in_balance(records):
    """The dataset is advertised as these nine skills; a missing or misspelt topic, or a lopsided one,
    skews the model."""
    counts = Counter(record["topic"] for record in records)
    assert set(counts) == TOPICS
    assert min(counts.values()) >= 25
    assert max(counts.values()) <= 2 * min(counts.values())


def test_no_duplicate_questions(records):
    """A repeated question (even differently cased or spaced) would be a duplicate or a train/eval leak."""
    questions = [" ".join(record["question"].lower().split()) for record in records]
    assert len(set(questions)) == len(questions), [q for q, n in Counter(questions).items() if n > 1]


def test_answers_are_substantial(records):
    """Answers are what the model learns to produce; one-word answers would teach it to be curt."""
    assert min(len(record["answer"]) for record in records) >= 80
    assert min(len(record["question"]) for record in records) >= 10


def test_preparing_it_yields_no_rejects_and_no_duplicates(tmp_path, records):
    """The default run must pass the data stage cleanly: every record becomes exactly one row."""
    result = prepare(str(bundled_dataset_path()), tmp_path / "out", PrepareOptions())
    stats = result.stats
    assert DataStats.read(tmp_path / "out" / "stats.json") == stats  # what the later steps read
    assert stats.records == len(records)
    assert stats.rejected == 0 and stats.duplicates == 0 and stats.blank_lines == 0
    assert read_rejects(tmp_path / "out") == []
    assert stats.shapes == {"question_answer": len(records)}
    assert stats.train_rows + stats.eval_rows == len(records) == len(all_rows(tmp_path / "out"))
    assert stats.eval_rows >= 15


def test_it_is_a_package_resource():
    """Installed code finds the file through importlib.resources, not a path relative to the checkout."""
    resource = resources.files("components.sample_data").joinpath(SAMPLE_FILE)
    assert resource.is_file()
    assert resource.read_bytes() == bundled_dataset_path().read_bytes()


def test_the_built_wheel_ships_the_dataset(tmp_path):
    """The container image installs the wheel; without package-data the default dataset would silently be missing."""
    source = tmp_path / "src"
    source.mkdir()
    # Exactly what the Containerfile copies into the image before it installs the project.
    copied = re.findall(r"^COPY (\S+) \./\S+$", (REPO_ROOT / "Containerfile").read_text(), flags=re.MULTILINE)
    packages = set(
        re.findall(r'"(\w+)\*"', re.search(r"include = \[(.*)\]", (REPO_ROOT / "pyproject.toml").read_text())[1])
    )
    assert set(copied) == packages, "the Containerfile must copy every package pyproject.toml installs"
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO_ROOT / name, source / name)
    for package in copied:
        shutil.copytree(REPO_ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            tmp_path / "dist",
            source,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read(f"components/sample_data/{SAMPLE_FILE}")
        templates = {name for name in archive.namelist() if name.endswith(".j2")}
        top_level = {name.split("/")[0] for name in archive.namelist() if name.endswith("/__init__.py")}
    assert shipped == bundled_dataset_path().read_bytes()
    assert top_level == packages
    # The templates the evaluation report and the model card are rendered from are package data too.
    assert {"components/evaluate/report.html.j2", "components/publish/model_card.md.j2"} <= templates
