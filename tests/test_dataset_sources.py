"""The ``dataset_sources`` run parameter end to end: its first-step checks, and the data stage reading the sources
it lists (local files, a glob and an object on the S3 server) with their own field maps."""

from __future__ import annotations

import hashlib
import json

import pytest
from conftest import read_stats, run_cli, write_jsonl
from first_step_run import paragraph, run_first_step

from common.errors import UserError
from components.data.options import PrepareOptions
from components.data.stage import resolve_inputs_of
from components.run_form.checks import problems, secret_problems

SIGNED = "https://bucket.s3.amazonaws.com/qa.jsonl?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc"


@pytest.mark.parametrize(
    ("sources", "words"),
    [
        ("[{", "parameter 'dataset_sources' is not valid JSON"),
        ('[{"uri": "a.jsonl", "weight": 0}]', "source 1 (a.jsonl) has the weight 0"),
        ('[{"uri": "a.jsonl", "weight": "3"}]', 'source 1 (a.jsonl) has the weight "3", which is not a number'),
        ('[{"uri": "a.jsonl", "weight": 1}, {"uri": "b.jsonl"}]', "but not to source 2"),
        ('[{"url": "a.jsonl"}]', "source 1 has the key 'url' (did you mean uri?)"),
        ('["a.jsonl", "ftp://host/b.jsonl"]', "has a source that is 'ftp://host/b.jsonl', whose scheme 'ftp' this"),
        ('["ftp://me:pw@host/b.jsonl"]', "has a source that is a URL that carries a credential (ftp://host/b.jsonl"),
    ],
)
def test_a_bad_source_list_is_named_in_the_run_parameter_checks(sources, words):
    (problem,) = problems({"dataset_sources": sources})
    assert words in problem


def test_dataset_uri_and_dataset_sources_together_are_refused():
    (problem,) = problems({"dataset_uri": "a.jsonl", "dataset_sources": '["b.jsonl"]'})
    assert problem.startswith("parameter 'dataset_sources' lists 1 source(s) and dataset_uri is 'a.jsonl' too")
    assert problems({"dataset_uri": "", "dataset_sources": '["b.jsonl", "c/*.jsonl"]'}) == []


def test_a_source_that_carries_a_credential_is_refused_without_repeating_it():
    (problem,) = problems({"dataset_sources": json.dumps(["data.jsonl", {"uri": SIGNED, "weight": None}])})
    assert problem.startswith("parameter 'dataset_sources' has a source that is a URL that carries a credential")
    assert "make secret:DATASET_URL that source's uri" in problem
    assert "AKIA" not in problem and "abc" not in problem
    (reference,) = problems({"dataset_sources": '["secret:AWS_SECRET_ACCESS_KEY"]'})
    assert "has a source that is 'secret:AWS_SECRET_ACCESS_KEY': the only Secret reference" in reference


def test_a_secret_source_needs_the_secret_key():
    values = {"dataset_sources": '["data.jsonl", "secret:DATASET_URL"]', "data_connection_secret": "mix"}
    missing = secret_problems(values, environ={})
    assert missing["dataset_sources"].startswith("has a source that is secret:DATASET_URL, but the key DATASET_URL")
    assert secret_problems(values, environ={"DATASET_URL": "https://data.example/qa.jsonl"}) == {}


def test_the_first_step_refuses_a_bad_source_list_in_one_paragraph():
    result = run_first_step({"dataset_sources": '[{"uri": "a.jsonl", "weight": -1}]'})
    assert result.returncode == 2, result.stdout + result.stderr
    message = paragraph(result.stderr)
    assert message.startswith("error: The run parameters are invalid: parameter 'dataset_sources' source 1 (a.jsonl)")
    assert "Traceback" not in result.stderr


def test_sources_resolve_to_their_files_with_their_field_maps(s3, tmp_path):
    """A local file, a glob and an S3 object: each remote one fetched into its own folder; a source without a
    field_map takes the run's."""
    local = write_jsonl(tmp_path / "local.jsonl", [{"q": "A?", "a": "B."}])
    write_jsonl(tmp_path / "many" / "1.jsonl", [{"question": "C?", "answer": "D."}])
    write_jsonl(tmp_path / "many" / "2.jsonl", [{"question": "E?", "answer": "F."}])
    s3.put_object(Bucket="qa-data", Key="general.jsonl", Body=b'{"question": "G?", "answer": "H."}\n')
    listed = json.dumps(
        [
            {"uri": str(local)},
            {"uri": str(tmp_path / "many" / "*.jsonl"), "field_map": {"question": "question"}},
            {"uri": "s3://qa-data/general.jsonl"},
        ]
    )
    download = tmp_path / "out" / "source"
    options = PrepareOptions(field_map='{"question": "q", "answer": "a"}')
    first, second, third = resolve_inputs_of("", listed, download, options, "sft")
    assert (first.files, first.source.field_map) == ([local], options.field_map)
    assert sorted(path.name for path in second.files) == ["1.jsonl", "2.jsonl"]
    assert second.source.field_map == '{"question": "question"}'
    assert third.files == [download / "3" / "general.jsonl"]
    assert third.files[0].read_bytes() == b'{"question": "G?", "answer": "H."}\n'

    with pytest.raises(UserError, match="dataset_uri and dataset_sources are both set"):
        resolve_inputs_of("a.jsonl", listed, download, options, "sft")
    with pytest.raises(UserError, match=r"^dataset_sources source 1 \(a.jsonl\) has the weight 0;"):
        resolve_inputs_of("", '[{"uri": "a.jsonl", "weight": 0}]', download, options, "sft")


def test_the_stage_cli_mixes_the_sources_it_is_given(tmp_path):
    domain = write_jsonl(tmp_path / "domain.jsonl", [{"question": f"D{i}?", "answer": f"d{i}."} for i in range(90)])
    general = write_jsonl(tmp_path / "general.jsonl", [{"input": f"G{i}?", "output": f"g{i}."} for i in range(90)])
    listed = json.dumps(
        [
            {"uri": str(domain), "weight": 2},
            {"uri": str(general), "weight": 1, "field_map": {"question": "input", "answer": "output"}},
        ]
    )
    result = run_cli("--sources", listed, "--output-dir", str(tmp_path / "out"), "--eval-fraction", "0.1")
    assert result.returncode == 0, result.stderr
    stats = read_stats(tmp_path / "out")
    domain_stats, general_stats = stats["sources"]
    assert domain_stats["train_rows"] == domain_stats["train_available"]
    assert abs(general_stats["train_rows"] - domain_stats["train_rows"] / 2) <= 1
    assert stats["rows"]["train"] == domain_stats["train_rows"] + general_stats["train_rows"]
    digests = [f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}" for path in (domain, general)]
    assert [(entry["uri"], entry["content"], entry["files"]) for entry in stats["lineage"]] == [
        (str(domain), digests[0], 1),
        (str(general), digests[1], 1),
    ]

    both = run_cli("--sources", listed, "--input", str(domain), "--output-dir", str(tmp_path / "other"))
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_a_missing_source_stops_the_step_in_one_paragraph_naming_it(tmp_path):
    present = write_jsonl(tmp_path / "present.jsonl", [{"question": "A?", "answer": "B."}])
    listed = json.dumps([str(present), str(tmp_path / "gone" / "*.jsonl")])
    result = run_cli("--sources", listed, "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert message.startswith(f"error: dataset_sources, source 2 ({tmp_path}/gone/*.jsonl): No .jsonl or .jsonl.gz")
    assert not (tmp_path / "out" / "stats.json").exists()
