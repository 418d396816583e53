"""The benchmark tasks' documents as text, for the data step's contamination check.

A task's document is what a model trained on it could have memorised: its question (lm-eval's decontamination
query when the task names one, else the prompt it renders, without the "Question:" and "Answer:" labels lm-eval's
templates put around it, which a copy of the question and answer in training data does not hold) and its correct
answer (the right choice of a multiple-choice task, the target of a generative one). The documents are the ones
the evaluation scores: the first ``benchmark_limit`` of the task's evaluation split (all with 0). Loading is the
evaluation's own (``components.benchmark_tasks.tasks.load_tasks``): the same names, task directories and refusal of
Python.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from common.errors import UserError, one_line
from components.benchmark_tasks.tasks import load_tasks


def task_documents(entries: list[str], root: Path, limit: int, allow_code: bool) -> dict[str, list[str]]:
    """Task name -> its scored documents' text, for every task ``entries`` (benchmark_tasks) names."""
    if not entries:
        return {}
    tasks = load_tasks(entries, root, limit, allow_code)
    return {name: _documents(name, task, tasks.examples[name]) for name, task in tasks.loaded.items()}


def _documents(name: str, task: Any, count: int) -> list[str]:
    documents = task.eval_docs
    try:
        return [_text(task, documents[position]) for position in range(count)]
    except Exception as error:  # a template or a target the task's own first document did not exercise
        raise UserError(
            f"the benchmark task {name} cannot render a document for the contamination check "
            f"({type(error).__name__}: {one_line(error, 200)}); check the task's doc_to_text and doc_to_target, or "
            "leave it out of benchmark_tasks."
        ) from None


# The labels lm-eval's prompt templates put before a question and after it ("Question: ...\nAnswer:", "Q: ... A:").
LEADING_LABEL = re.compile(r"^\s*(?:question|q)\s*:\s*", re.IGNORECASE)
TRAILING_LABEL = re.compile(r"\s*(?:answer|a)\s*:\s*$", re.IGNORECASE)


def _unlabelled(prompt: str) -> str:
    return TRAILING_LABEL.sub("", LEADING_LABEL.sub("", prompt))


def _text(task: Any, document: Any) -> str:
    """The document's question and correct answer, as one text."""
    query = task.doc_to_decontamination_query(document) if task.should_decontaminate() else None
    question = query if query is not None else _unlabelled(str(task.doc_to_text(document)))
    target = task.doc_to_target(document)
    if task.OUTPUT_TYPE == "multiple_choice":
        choices = task.doc_to_choice(document)
        targets = target if isinstance(target, list) else [target]
        answers = [choices[one] if isinstance(one, int) else one for one in targets]
    else:
        answers = target if isinstance(target, list) else [target]
    return "\n".join([str(question), *map(str, answers)])
