"""YAML the tests read, parsed with libyaml's parser where PyYAML was built with it (PyPI's wheels are).

The files the tests read again and again are large: the compiled pipeline (270 kB), the vendored CRDs (up to
2 MB) and the Model Registry's OpenAPI spec. PyYAML's pure-Python parser took 0.31 s for the pipeline, 0.18 s for
the spec and 2.6 s for KServe's InferenceService CRD; libyaml's 0.08, 0.02 and 0.9 s, with equal documents. The
safe constructor is the same either way, so what a document means does not change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def read_yaml(path: Path) -> Any:
    return yaml.load(Path(path).read_text(encoding="utf-8"), Loader=SAFE_LOADER)


def read_yaml_documents(path: Path) -> list[Any]:
    return list(yaml.load_all(Path(path).read_text(encoding="utf-8"), Loader=SAFE_LOADER))
