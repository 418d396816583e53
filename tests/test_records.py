"""common/records.py: the typed records stages hand each other, their format version, and older files refused
with one paragraph."""

from __future__ import annotations

import dataclasses
import json

import pytest

from common.errors import UserError
from common.records import (
    FORMAT_VERSION,
    DataStats,
    EvaluationResult,
    GgufVerification,
    Registration,
    SampleAnswer,
    SampleAnswers,
    Served,
    StoredCopies,
    StoredCopy,
    TrainingSummary,
)

COPIES = (
    StoredCopy("s3://models/team/smol-ft/run-1/", files=14, total_bytes=20_000),
    StoredCopy("oci://quay.io/team/smol-ft:run-1", files=14, total_bytes=20_000, digest="sha256:" + "c" * 64),
)


def test_stored_copies_round_trip_with_their_format_version(tmp_path):
    path = tmp_path / "store" / "stored.json"
    StoredCopies(COPIES).write(path)
    assert json.loads(path.read_text())[FORMAT_VERSION] == StoredCopies.VERSION
    assert StoredCopies.read(path) == StoredCopies(COPIES)
    assert [copy.scheme for copy in StoredCopies.read(path).copies] == ["s3", "oci"]
    assert StoredCopies.read(tmp_path / "absent.json") == StoredCopies()  # the store step has not run
    # before the format version the file was the bare list of copies, with the same fields
    path.write_text(json.dumps([dataclasses.asdict(copy) for copy in COPIES]))
    assert StoredCopies.read(path) == StoredCopies(COPIES)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (json.dumps({"copies": []}), "a format without a version"),
        (json.dumps([{"uri": "s3://m/x/", "files": 1}]), "entry 1 of its copies has no total_bytes"),
        (json.dumps({FORMAT_VERSION: 2, "copies": []}), "format 2, and this version of the pipeline reads format 1"),
        (
            json.dumps({FORMAT_VERSION: 1, "copies": [{"uri": "s3://m/x/", "files": 1}]}),
            "entry 1 of its copies has no ",
        ),
        (json.dumps({FORMAT_VERSION: 1, "copies": "s3://m/x/"}), "its copies are not a list of objects"),
        ("{", "is not the JSON stored copies record"),
    ],
    ids=["unversioned", "old-missing-field", "newer", "missing-field", "not-a-list", "not-json"],
)
def test_a_record_of_another_format_is_refused_with_what_to_do(tmp_path, text, says):
    path = tmp_path / "stored.json"
    path.write_text(text)
    with pytest.raises(UserError) as refused:
        StoredCopies.read(path)
    message = str(refused.value)
    assert str(path) in message and says in message and "Rerun the store step" in message
    assert "\n" not in message


REGISTRATION = Registration("https://registry", "3", "7", {"smol-ft-s3": "9"}, created=True)
SERVED = Served("smol-ft", "ml-team", "http://smol-ft-predictor.ml-team.svc", "smol-ft", "Hi?", "Hello.")


@pytest.mark.parametrize("record", [REGISTRATION, SERVED], ids=["registered", "served"])
def test_one_record_or_none_round_trips_and_reads_the_format_before_versions(tmp_path, record):
    """registered.json and served.json hold one record, or null when the step had nothing to do (no registry URL,
    deploy off); before the format version the file was that object or null itself."""
    kind, path = type(record), tmp_path / "record.json"
    assert kind.read(path) is None  # the step has not run
    kind.write(path, record)
    assert json.loads(path.read_text())[FORMAT_VERSION] == kind.VERSION and kind.read(path) == record
    kind.write(path, None)
    assert kind.read(path) is None
    path.write_text(json.dumps(dataclasses.asdict(record)))
    assert kind.read(path) == record
    path.write_text("null\n")
    assert kind.read(path) is None


def test_a_registration_missing_a_field_is_refused_naming_it(tmp_path):
    path = tmp_path / "registered.json"
    path.write_text(json.dumps({"model_version_id": "7"}))
    with pytest.raises(UserError, match="has no artifact_ids, created, registered_model_id, url. Rerun the register"):
        Registration.read(path)
    path.write_text(json.dumps({FORMAT_VERSION: 9, "registration": None}))
    with pytest.raises(UserError, match="format 9, and this version of the pipeline reads format 1"):
        Registration.read(path)


def test_a_training_summary_round_trips_and_reads_the_format_before_versions(tmp_path):
    from fake_run import training_summary

    path, summary = tmp_path / "train" / "training_summary.json", training_summary("org/base-model")
    assert TrainingSummary.read(path) is None  # the trainer has not finished
    summary.write(path)
    written = json.loads(path.read_text())
    assert written[FORMAT_VERSION] == TrainingSummary.VERSION and written["config"]["model"] == "org/base-model"
    assert TrainingSummary.read(path) == summary
    assert (summary.base_model, summary.method, summary.max_length) == ("org/base-model", "lora", 1024)
    del written[FORMAT_VERSION]  # as the trainer wrote it before the format version, with the same keys
    path.write_text(json.dumps(written))
    assert TrainingSummary.read(path) == summary
    # as the trainer's first release wrote it (2026-11-22): the fields added since are None
    later = ("base_model_commit", "sharding", "attention", "compiled_blocks", "compile", "speed_fallback")
    first = {key: value for key, value in written.items() if key not in later}
    first["ranks"] = [
        {key: rank[key] for key in ("rank", "device", "tokens", "weights_sha256")} for rank in first["ranks"]
    ]
    path.write_text(json.dumps(first))
    old = TrainingSummary.read(path)
    assert (old.base_model_commit, old.attention, old.compiled_blocks, old.ranks[0].peak_memory_mb) == (None,) * 4
    assert old.tokens_seen == summary.tokens_seen and old.base_model == "org/base-model"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda value: value.pop("tokens_seen"), "its training summary has no tokens_seen"),
        (lambda value: value["config"].pop("model"), "its training summary has no config.model"),
        (lambda value: value["ranks"][1].pop("device"), "entry 2 of its ranks has no device"),
        (lambda value: value.update({"global_step": None}), "its training summary has no global_step"),
        (lambda value: value.update({"devices": None}), "its training summary has no devices"),
        (lambda value: value.update({FORMAT_VERSION: 2}), "format 2, and this version of the pipeline reads format 1"),
    ],
    ids=["missing-field", "no-base-model", "rank-missing-field", "null", "null-devices", "newer"],
)
def test_a_training_summary_missing_a_field_is_refused_naming_it(tmp_path, change, says):
    from fake_run import training_summary

    path = tmp_path / "training_summary.json"
    value = training_summary().as_json()
    change(value)
    path.write_text(json.dumps(value))
    with pytest.raises(UserError) as refused:
        TrainingSummary.read(path)
    message = str(refused.value)
    assert str(path) in message and says in message and "train this run again" in message and "\n" not in message
    with pytest.raises(UserError, match="restore the file"):
        TrainingSummary.read(path, fix="restore the file")  # a published one is not retrained


def test_an_evaluation_round_trips_leaving_out_what_was_not_compared(tmp_path):
    """evaluation.json keeps the shape it had before the record: the published model's entries only when one was
    compared, a comparison's benchmark only for a benchmark comparison."""
    from fake_run import evaluation

    path, record = tmp_path / "evaluate" / "evaluation.json", evaluation(published_model={"run_id": "r0"})
    assert EvaluationResult.read(path) is None  # the step has not run
    record.write(path)
    written = json.loads(path.read_text())
    assert written[FORMAT_VERSION] == EvaluationResult.VERSION
    assert "published" not in written and "deltas_vs_published" not in written and "published_search" not in written
    assert written["published_model"] == {"run_id": "r0"}
    assert written["gate"]["comparisons"] == [{"against": "base", "passed": True, "reason": record.gate.reason}]
    assert "min_improvement_over_published" not in written["gate"]
    assert EvaluationResult.read(path) == record
    del written[FORMAT_VERSION]  # as the step wrote it before the format version
    path.write_text(json.dumps(written))
    assert EvaluationResult.read(path) == record
    # as the first release wrote it (2026-11-23): no benchmarks, held-out counts or gate comparisons yet
    first = {key: value for key, value in written.items() if key not in ("base_model_commit", "held_out", "benchmarks")}
    first["gate"] = {key: written["gate"][key] for key in ("passed", "min_eval_loss_improvement", "reason")}
    path.write_text(json.dumps(first))
    old = EvaluationResult.read(path)
    assert (old.benchmarks, old.held_out, old.gate.comparisons, old.gate.forced) == (None, None, (), False)
    assert old.gate.passed and old.fine_tuned == record.fine_tuned


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda value: value.pop("gate"), "its evaluation has no gate"),
        (lambda value: value.update({"gate": None}), "its evaluation has no gate"),
        (lambda value: value["gate"].pop("reason"), "its gate has no reason"),
        (lambda value: value["fine_tuned"].pop("eval_loss"), "its fine-tuned model's scores has no eval_loss"),
        (lambda value: value["gate"]["comparisons"][0].pop("passed"), "entry 1 of its gate's comparisons has no"),
        (lambda value: value.update({FORMAT_VERSION: 3}), "format 3, and this version of the pipeline reads format 1"),
    ],
    ids=["no-gate", "null-gate", "gate-field", "scores-field", "comparison-field", "newer"],
)
def test_an_evaluation_missing_a_field_is_refused_naming_it(tmp_path, change, says):
    from fake_run import evaluation

    path = tmp_path / "evaluation.json"
    value = evaluation().as_json()
    change(value)
    path.write_text(json.dumps(value))
    with pytest.raises(UserError) as refused:
        EvaluationResult.read(path)
    message = str(refused.value)
    assert str(path) in message and says in message and "Rerun the evaluation step" in message


def test_data_stats_round_trip_and_read_the_format_before_versions(tmp_path):
    from fake_run import data_stats

    path, stats = tmp_path / "data" / "stats.json", data_stats()
    assert DataStats.read(path) is None  # the data step has not run
    stats.write(path)
    written = json.loads(path.read_text())
    assert written[FORMAT_VERSION] == DataStats.VERSION and written["rows"] == {"train": 270, "eval": 30}
    assert DataStats.read(path) == stats and (stats.train_rows, stats.eval_rows) == (270, 30)
    del written[FORMAT_VERSION]  # as the data step wrote it before the format version, with the same keys
    path.write_text(json.dumps(written))
    assert DataStats.read(path) == stats


def test_a_gguf_verification_round_trips_and_reads_the_format_before_versions(tmp_path):
    from fake_run import gguf_verification

    path, verification = tmp_path / "export" / "verification.json", gguf_verification(tmp_path / "export")
    assert GgufVerification.read(path) is None  # the export step has not run
    verification.write(path)
    written = json.loads(path.read_text())
    assert written[FORMAT_VERSION] == GgufVerification.VERSION and written["modelfile"] == "Modelfile"
    assert [entry["outtype"] for entry in written["files"]] == ["q8_0", "lora"]
    assert GgufVerification.read(path) == verification
    del written[FORMAT_VERSION]  # as the export step wrote it before the format version
    path.write_text(json.dumps(written))
    assert GgufVerification.read(path) == verification


def _data_stats(directory):
    from fake_run import data_stats

    return data_stats()


def _gguf_verification(directory):
    from fake_run import gguf_verification

    return gguf_verification(directory)


@pytest.mark.parametrize(
    ("record", "change", "says"),
    [
        (_data_stats, lambda value: value.pop("fingerprint"), "its data statistics has no fingerprint"),
        (_data_stats, lambda value: value.update({"records": None}), "its data statistics has no records"),
        (
            _data_stats,
            lambda value: value["rows"].pop("eval"),
            "rows are not a count per split (train and eval)",
        ),
        (_gguf_verification, lambda value: value.pop("passed"), "its GGUF verification has no passed"),
        (_gguf_verification, lambda value: value["files"][1].pop("gguf"), "entry 2 of its files has no gguf"),
        (
            _gguf_verification,
            lambda value: value.update({"conversions": {"path": "x"}}),
            "its conversions are not a list of objects",
        ),
    ]
    + [
        (
            record,
            lambda value: value.update({FORMAT_VERSION: 2}),
            "format 2, and this version of the pipeline reads format 1",
        )
        for record in (_data_stats, _gguf_verification)
    ],
    ids=[
        "stats-missing-field",
        "stats-null",
        "stats-rows-without-eval",
        "verification-missing-field",
        "verification-file-missing-field",
        "verification-conversions-not-a-list",
        "stats-newer",
        "verification-newer",
    ],
)
def test_data_stats_and_a_gguf_verification_missing_a_field_are_refused_naming_it(tmp_path, record, change, says):
    path, written = tmp_path / "record.json", record(tmp_path)
    value = written.as_json()
    change(value)
    path.write_text(json.dumps(value))
    with pytest.raises(UserError) as refused:
        type(written).read(path)
    message = str(refused.value)
    assert str(path) in message and says in message and written.FIX in message and "\n" not in message


def test_sample_answers_round_trip_and_read_the_bare_list_before_versions(tmp_path):
    path = tmp_path / "evaluate" / "demo_outputs" / "sample_responses.json"
    assert SampleAnswers.read(path) == SampleAnswers()  # the evaluation step has not run
    answers = SampleAnswers((SampleAnswer("Q?", "b", "f"), SampleAnswer("R?", "b2", "f2", published="p2")))
    answers.write(path)
    written = json.loads(path.read_text())
    assert written[FORMAT_VERSION] == SampleAnswers.VERSION
    assert written["answers"][0] == {"question": "Q?", "base": "b", "fine_tuned": "f"}  # published only when compared
    assert SampleAnswers.read(path) == answers
    path.write_text(json.dumps(written["answers"]))  # as the step wrote it before the format version
    assert SampleAnswers.read(path) == answers
    path.write_text(json.dumps([{"question": "Q?", "base": "b"}]))
    with pytest.raises(UserError, match="entry 1 of its answers has no fine_tuned. Rerun the evaluation step"):
        SampleAnswers.read(path)
