"""pipelines/run_summary.py: the end of a local run, read from the records the stages wrote."""

from __future__ import annotations

from fake_run import make_run

from components.champion.card import CARD_NAME
from components.champion.record import PublishedRecord, write_record
from pipelines.run_summary import summary_lines


def _published(workspace, run_id: str, repo_id: str) -> None:
    write_record(
        str(workspace),
        PublishedRecord(repo_id, bool(repo_id), "sha256:" + "ab" * 32, run_id, "here", "2026-11-28T00:00:00Z"),
    )


def test_the_summary_names_each_stage_s_outputs_from_its_record(tmp_path):
    run = make_run(tmp_path, "run-1")
    (run / "publish" / "upload").mkdir(parents=True)
    (run / "publish" / "upload" / CARD_NAME).write_text("# card\n")
    _published(tmp_path, "run-1", "")
    lines = summary_lines(run)
    text = "\n".join(lines)
    assert "  data:       270 train / 30 eval conversations, 0 rejected, 0 duplicates" in lines
    assert f"  GGUF:       {run / 'export' / 'practical-skills-q8_0.gguf'}, " in text
    assert "  llama.cpp:  verification passed" in lines
    assert f"  Modelfile:  {run / 'export' / 'Modelfile'}" in lines
    assert f"ollama create my-model -f {run / 'export' / 'Modelfile'}" in text
    assert "(a dry run: set repo_id to publish)" in text

    (tmp_path / "published" / "dry-run.json").unlink()  # published to a repository instead
    _published(tmp_path, "run-1", "team/smol-ft")
    assert "(uploaded to team/smol-ft)" in "\n".join(summary_lines(run))
