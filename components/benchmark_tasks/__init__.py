"""lm-eval benchmark tasks as this pipeline reads them: loaded and checked (``tasks``, ``task_checks``,
``registry_names``), scored by the evaluate step, and their documents checked against the training rows by the
data step (``documents``). Not a stage: both stages read the same tasks the same way through it."""
