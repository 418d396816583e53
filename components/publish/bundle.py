"""What a publish uploads: the earlier stages' files, read, checked and laid out as the repository.

The folder ``<run>/publish/upload/`` is built first, always; a real publish
commits exactly that folder and a dry run stops there, so what a dry run shows
is what would have been uploaded. Large files are hard-linked into it (same
filesystem: the workspace), so it costs no space; it is swapped in atomically.

Repository layout::

    README.md                      model card
    <model>-<outtype>.gguf         every GGUF of the export stage (LoRA GGUF too)
    Modelfile                      Ollama, FROM ./<model>-<outtype>.gguf
    training_summary.json
    evaluation/                    evaluation.json, report.md, loss_curve.png, sample_responses.json
    verification/                  the GGUF verification report, when present
    config.json, *.safetensors...  merged checkpoint (PublishOptions.publishes_merged), for transformers
    adapter/                       LoRA adapter (publish_adapter)
"""

from __future__ import annotations

from pathlib import Path

from common.atomic import link_or_copy, replace_dir
from common.errors import UserError
from common.run_layout import (
    ADAPTER,
    EVALUATION,
    EVALUATION_MARKDOWN,
    LOSS_CURVE,
    MERGED,
    MODELFILE,
    SAMPLE_RESPONSES,
    TRAINING_SUMMARY,
    VERIFICATION_JSON,
    VERIFICATION_MARKDOWN,
)
from components.champion.card import CARD_NAME
from components.champion.version import MERGED_CONFIG, RunDirs, RunOutputs
from components.publish.options import PublishOptions


def upload_plan(dirs: RunDirs, outputs: RunOutputs, options: PublishOptions) -> dict[str, Path]:
    """Path in the repository → local file, for everything except the model card."""
    plan: dict[str, Path] = {}
    adapter = dirs.train / ADAPTER
    adapter_trained = (adapter / "adapter_config.json").is_file()
    if options.publishes_merged(adapter_trained):
        merged = dirs.train / MERGED
        if not (merged / MERGED_CONFIG).is_file():
            raise UserError(
                f"publish_merged is {options.publish_merged} but {merged} holds no checkpoint (no config.json); "
                "the training stage writes it. Set publish_merged to false or rerun training."
            )
        plan.update(_tree(merged, "", skip={CARD_NAME}))
    for path in [*outputs.ggufs, *outputs.lora_ggufs, dirs.export / MODELFILE, dirs.train / TRAINING_SUMMARY]:
        plan[path.name] = path
    for name in (EVALUATION, EVALUATION_MARKDOWN, LOSS_CURVE):
        if (dirs.evaluate / name).is_file():
            plan[f"evaluation/{name}"] = dirs.evaluate / name
    if (dirs.evaluate / SAMPLE_RESPONSES).is_file():
        plan["evaluation/sample_responses.json"] = dirs.evaluate / SAMPLE_RESPONSES
    for name in (VERIFICATION_JSON, VERIFICATION_MARKDOWN):
        if (dirs.export / name).is_file():
            plan[f"verification/{name}"] = dirs.export / name
    if options.publish_adapter and adapter_trained:
        plan.update(_tree(adapter, "adapter/"))
    return plan


def _tree(root: Path, prefix: str, skip: set[str] = frozenset()) -> dict[str, Path]:
    """Every visible file under ``root`` as ``prefix + relative path``."""
    files = {}
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if (
            path.is_file()
            and relative not in skip
            and not any(part.startswith(".") for part in path.relative_to(root).parts)
        ):
            files[prefix + relative] = path
    return files


def write_upload_folder(plan: dict[str, Path], card: str, target: Path) -> None:
    """Lay ``plan`` and the model card out in ``target``, replacing an earlier folder atomically."""

    def fill(folder: Path) -> None:
        for path_in_repo, source in plan.items():
            link_or_copy(source, folder / path_in_repo)
        (folder / CARD_NAME).write_text(card, encoding="utf-8")

    replace_dir(target, fill)
