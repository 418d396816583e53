"""Each source's lineage after the data step: in the data report, the model card (page and metadata), the Model
Registry's properties, and the next run's change check, from objects on the S3 server (moto) in a versioned bucket.
"""

from __future__ import annotations

import dataclasses
import json

from conftest import DATA_BUCKET, qa
from fake_run import data_stats, make_run, training_summary
from huggingface_hub import ModelCard

from common.records import DataStats, RemoteVersion, SourceLineage, SourceStats, SourceTokens, TrainingSummary
from common.run_layout import DATA_STATS, PUBLISH, TRAINING_SUMMARY, UPLOAD, stage_dir
from components.champion.card import read_lineage
from components.data.options import PrepareOptions
from components.data.prepare import prepare
from components.data.report import data_report
from components.data.stage import resolve_inputs_of
from components.publish.changes import compare_with_published
from components.publish.options import PublishOptions
from components.publish.publish import publish
from components.register.provenance import source_properties

LINES = b"".join(json.dumps(qa(i)).encode() + b"\n" for i in range(40))
URI = f"s3://{DATA_BUCKET}/qa/train.jsonl"


def prepare_run(workspace, run_id: str) -> DataStats:
    """The data step of ``run_id`` on the S3 object, into the run's data directory."""
    data = stage_dir(str(workspace), run_id, "data")
    source = resolve_inputs_of(URI, "", data / "source", PrepareOptions(eval_fraction=0.1), "sft")
    return prepare(source, data, PrepareOptions(eval_fraction=0.1)).stats


def test_the_change_check_names_a_new_s3_version_of_a_source(s3, tmp_path):
    """A published dry run records the object's version in its card; a new version with other rows is 'changed'
    and named, one with the same rows is 'unchanged' and still named."""
    s3.put_bucket_versioning(Bucket=DATA_BUCKET, VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket=DATA_BUCKET, Key="qa/train.jsonl", Body=LINES)
    make_run(tmp_path)
    published = prepare_run(tmp_path, "run-1")  # the real data step's stats replace the fake run's
    publish(str(tmp_path), "run-1", URI, PublishOptions(), token=None)

    card = (stage_dir(str(tmp_path), "run-1", PUBLISH) / UPLOAD / "README.md").read_text()
    (recorded,) = read_lineage(card)
    assert recorded == published.lineage[0] and recorded.remote.version_id == first["VersionId"]
    assert ModelCard(card).data.to_dict()["data_sources"][0]["remote"]["version_id"] == first["VersionId"]
    assert "### Training data sources" in card and f"VersionId {first['VersionId']}" in card

    second = s3.put_object(Bucket=DATA_BUCKET, Key="qa/train.jsonl", Body=LINES + json.dumps(qa(99)).encode() + b"\n")
    now = prepare_run(tmp_path, "run-2")
    change = compare_with_published(now.fingerprint, "", str(tmp_path), False, None, lineage=now.lineage)
    assert change.changed
    assert (
        f"Since then: {URI} was read at VersionId {first['VersionId']}, ETag {first['ETag']}, now at VersionId "
        f"{second['VersionId']}, ETag {second['ETag']}." in change.reason
    )

    third = s3.put_object(Bucket=DATA_BUCKET, Key="qa/train.jsonl", Body=LINES)  # the first rows again
    again = prepare_run(tmp_path, "run-3")
    same = compare_with_published(again.fingerprint, "", str(tmp_path), False, None, lineage=again.lineage)
    assert not same.changed
    assert f"now at VersionId {third['VersionId']}" in same.reason
    assert "but the rows prepared from them are the same" in same.reason

    # a card from before lineage compares the fingerprint alone, and says nothing of sources
    before = data_stats(published.fingerprint, lineage=())
    before.write(stage_dir(str(tmp_path), "run-1", "data") / DATA_STATS)
    publish(str(tmp_path), "run-1", URI, PublishOptions(), token=None)
    plain = compare_with_published(again.fingerprint, "", str(tmp_path), False, None, lineage=again.lineage)
    assert not plain.changed and "sources" not in plain.reason


def test_the_report_and_the_registry_name_each_source():
    lineage = (
        SourceLineage("s3://b/domain/", "sha256:" + "a" * 64, 3, RemoteVersion(objects="sha256:" + "b" * 64)),
        SourceLineage("hf://datasets/org/general", "sha256:" + "c" * 64, 1, RemoteVersion(revision="f" * 40)),
    )
    sources = (
        SourceStats("s3://b/domain/", 3.0, 500, 10, {"empty_response": 10}, 5, 0, 440, 440, 45, 0.75),
        SourceStats("hf://datasets/org/general", 1.0, 900, 0, {}, 0, 2, 810, 147, 88, 0.25),
    )
    stats = dataclasses.replace(data_stats(), sources=sources, lineage=lineage)
    report = data_report(stats)
    assert "| `s3://b/domain/` (3 files) | objects sha256:bbbb" in report
    assert "| 3 | 440 of 440 (75.0%) | 45 | 500 | 10 (empty_response 10) | 5 / 0 |" in report
    assert f"| `hf://datasets/org/general` | revision {'f' * 40} | `sha256:cccccccccccc…` | 1 | 147 of 810" in report

    properties = source_properties(lineage)
    assert properties == {
        "data_source_1": "s3://b/domain/",
        "data_source_1_content": "sha256:" + "a" * 64,
        "data_source_1_version": "objects sha256:" + "b" * 64,
        "data_source_2": "hf://datasets/org/general",
        "data_source_2_content": "sha256:" + "c" * 64,
        "data_source_2_version": "revision " + "f" * 40,
    }
    plain = dataclasses.replace(lineage[0], remote=RemoteVersion())
    assert source_properties((plain,)) == {"data_source_1": plain.uri, "data_source_1_content": plain.content}


def test_the_model_card_gives_each_sources_share_of_the_training_tokens(tmp_path):
    """The data step's rows per source beside the tokenise step's tokens per source (carried by the training
    summary): the share of loss tokens is the weight a source really had, which rows alone do not tell."""
    lineage = (
        SourceLineage("s3://b/domain/", "sha256:" + "a" * 64, 3, RemoteVersion(objects="sha256:" + "b" * 64)),
        SourceLineage("hf://datasets/org/general", "sha256:" + "c" * 64, 1, RemoteVersion(revision="f" * 40)),
    )
    sources = (
        SourceStats("s3://b/domain/", 1.0, 300, 0, {}, 0, 0, 250, 135, 30, 0.5),
        SourceStats("hf://datasets/org/general", 1.0, 300, 0, {}, 0, 0, 250, 135, 30, 0.5),
    )
    tokens = (
        SourceTokens("s3://b/domain/", 135, 90_000, 60_000),
        SourceTokens("hf://datasets/org/general", 135, 30_000, 20_000),
    )
    make_run(tmp_path)
    data, train = (stage_dir(str(tmp_path), "run-1", stage) for stage in ("data", "train"))
    dataclasses.replace(data_stats(), sources=sources, lineage=lineage).write(data / DATA_STATS)
    training_summary(source_tokens=tokens).write(train / TRAINING_SUMMARY)
    assert TrainingSummary.read(train / TRAINING_SUMMARY).source_tokens == tokens  # read back as records
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)

    card = (stage_dir(str(tmp_path), "run-1", PUBLISH) / UPLOAD / "README.md").read_text()
    assert "| training tokens | with loss (share) |" in card
    assert "| 135 of 250 (50.0%) | 30 | 300 | 0 | 0 / 0 | 90,000 | 60,000 (75.0%) |" in card
    assert "| 30,000 | 20,000 (25.0%) |" in card
    assert "their share is the weight the source really had" in card

    # a summary without them (one source, or from before): the rows alone, no token columns
    training_summary().write(train / TRAINING_SUMMARY)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    card = (stage_dir(str(tmp_path), "run-1", PUBLISH) / UPLOAD / "README.md").read_text()
    assert "| 135 of 250 (50.0%) | 30 | 300 | 0 | 0 / 0 |\n" in card and "training tokens" not in card

    # tokens of other sources (a summary from another data directory): neither the columns nor their note
    other = tuple(dataclasses.replace(source, uri=f"{source.uri}-elsewhere") for source in tokens)
    training_summary(source_tokens=other).write(train / TRAINING_SUMMARY)
    publish(str(tmp_path), "run-1", "", PublishOptions(), token=None)
    card = (stage_dir(str(tmp_path), "run-1", PUBLISH) / UPLOAD / "README.md").read_text()
    assert "training tokens" not in card and "the weight the source really had" not in card


def test_the_training_summary_names_no_source_when_the_data_directory_is_gone(prepared_data_dir, tmp_path):
    """A token cache entry can outlive its run's data directory; the summary then names no source (None), rather
    than another run's."""
    from types import SimpleNamespace

    from trainer.data import data_sources

    expected = DataStats.read(prepared_data_dir / DATA_STATS).lineage
    assert data_sources(SimpleNamespace(data_dir=str(prepared_data_dir))) == expected != ()
    assert data_sources(SimpleNamespace(data_dir=str(tmp_path / "deleted"))) is None
