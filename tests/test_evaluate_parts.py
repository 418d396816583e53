"""The evaluation stage's parts on their own: loss as in training, batched generation, ROUGE-L, gate, report, options.

Models are the tiny random Llama with SmolLM2's real tokenizer (cut to its first 2048 ids) and chat
template (see conftest), so each forward pass takes milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import tokenised
from fake_run import training_summary
from transformers import AutoModelForCausalLM, GenerationConfig

from common.errors import UserError
from common.records import SampleAnswer
from components.data.schema import OUTPUT_SCHEMA
from components.evaluate.gate import (
    EVAL_LOSS,
    REWARD_ACCURACY,
    benchmark_comparisons,
    decide,
    decide_with_published,
    decide_without_published,
)
from components.evaluate.generation import end_of_turn_id, generate_answers, stop_token_ids
from components.evaluate.heldout import held_out_loss, usable_conversations
from components.evaluate.models import load_model, load_tokenizer
from components.evaluate.options import DEFAULT_QUESTIONS, EvaluateOptions, build_parser, parse_options
from components.evaluate.reference import reference_rows, rouge_l
from components.evaluate.report import render_html, render_markdown
from trainer.data import split_path


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def held_out(model_dir, data_dir, max_length):
    """The evaluation's held-out conversations, from the tokenise step's entry for ``data_dir``."""
    if not split_path(data_dir, "train").is_file():
        pq.write_table(OUTPUT_SCHEMA.empty_table(), split_path(data_dir, "train"))
    return usable_conversations(tokenised(model_dir, data_dir), max_length)


def test_held_out_loss_is_the_training_loss_averaged_over_every_assistant_token(
    tiny_model, tiny_model_dir, tokenizer, prepared_data_dir
):
    """Each conversation scored alone, as the model scores labels that are -100 outside the assistant turns,
    then token-weighted."""
    conversations = held_out(tiny_model_dir, prepared_data_dir, max_length=96)
    total_nll, total_tokens = 0.0, 0
    with torch.no_grad():
        for conversation in conversations:
            ids = torch.tensor([conversation.input_ids])
            labels = torch.where(torch.tensor([conversation.assistant_masks]).bool(), ids, -100)
            tokens = int(sum(conversation.assistant_masks[1:]))
            total_nll += tiny_model(input_ids=ids, labels=labels).loss.item() * tokens
            total_tokens += tokens
    expected = total_nll / total_tokens

    for batch_size in (1, 5):
        result = held_out_loss(tiny_model, conversations, tokenizer.pad_token_id, batch_size)
        assert result.eval_tokens == total_tokens
        assert result.eval_loss == pytest.approx(expected, rel=1e-5)
        assert result.perplexity == pytest.approx(math.exp(expected), rel=1e-5)
    assert all(len(conversation.input_ids) <= 96 for conversation in conversations)


def write_eval_split(data_dir, rows):
    data_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=OUTPUT_SCHEMA), split_path(data_dir, "eval"))


def test_an_empty_eval_split_names_the_file_and_the_eval_fraction(tiny_model_dir, tmp_path):
    write_eval_split(tmp_path / "data", [])
    with pytest.raises(UserError, match=r"eval_conversations\.arrow has no rows.*eval_fraction above 0"):
        held_out(tiny_model_dir, tmp_path / "data", max_length=1024)


def test_conversations_truncated_before_the_answer_are_not_usable(tiny_model_dir, tmp_path):
    """The default system prompt and a long question fill max_length: no assistant token is left to score."""
    long_question = {"role": "user", "content": "Tell me about knots. " * 20}
    write_eval_split(
        tmp_path / "data",
        [{"id": 1, "messages": [long_question, {"role": "assistant", "content": "Use a bowline."}]}],
    )
    assert held_out(tiny_model_dir, tmp_path / "data", max_length=1024)
    with pytest.raises(
        UserError,
        match=r"none of the 1 eval conversations in .* has an assistant token within the first 64 tokens.*--max-length",
    ):
        held_out(tiny_model_dir, tmp_path / "data", max_length=64)


@pytest.mark.slow
def test_batched_left_padded_generation_gives_each_prompt_its_own_greedy_answer(smollm2_dir):
    """Padding must not leak into answers: prompts of different lengths, batched or alone, give the same text.

    SmolLM2 itself, since the tiny random model only ever emits newlines.
    """
    model, tokenizer = load_model(smollm2_dir), load_tokenizer(smollm2_dir)
    prompts = [
        [{"role": "user", "content": "Hi"}],
        [{"role": "user", "content": "What is the easiest loop knot to tie when the rope is wet and cold?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "How many cups in a gallon?"}],
    ]
    batched = generate_answers(model, tokenizer, prompts, max_new_tokens=12, batch_size=3)
    alone = [generate_answers(model, tokenizer, [prompt], max_new_tokens=12, batch_size=1)[0] for prompt in prompts]
    assert batched == alone
    assert all(len(answer.split()) >= 3 for answer in batched), batched


def test_generation_stops_at_the_templates_end_of_turn_token(tokenizer):
    """SmolLM2's template closes a turn with <|im_end|>; it is a stop token even when the model's config names
    another EOS."""
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert end_of_turn_id(tokenizer) == im_end
    model_with_other_eos = SimpleNamespace(generation_config=GenerationConfig(eos_token_id=[0, 7]))
    assert stop_token_ids(model_with_other_eos, tokenizer) == [0, 7, im_end]


def test_reference_rows_ask_everything_before_the_last_answer():
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Which knot makes a fixed loop?"},
        {"role": "assistant", "content": "A bowline."},
        {"role": "user", "content": "And to join two ropes?"},
        {"role": "assistant", "content": "A sheet bend."},
    ]
    (row,) = reference_rows([conversation, conversation], limit=1)
    assert row.prompt == conversation[:4]
    assert row.reference == "A sheet bend."
    assert len(reference_rows([conversation] * 5, limit=3)) == 3


def test_rouge_l_is_the_longest_common_subsequence_f_measure():
    assert rouge_l(["The cat sat on the mat."], ["the cat sat on the mat"]) == pytest.approx(1.0)
    assert rouge_l(["completely different words"], ["the cat sat on the mat"]) == 0.0
    # LCS "the cat on the mat" = 5 of 6 words on both sides; the mean is over rows.
    assert rouge_l(["the cat lay on the mat", "x"], ["the cat sat on the mat", "y"]) == pytest.approx((5 / 6) / 2)


@pytest.mark.parametrize(
    ("base", "tuned", "minimum", "passed", "words"),
    [
        (2.5, 2.0, 0.0, True, "improved by 0.5000 (base 2.5000, fine-tuned 2.0000), which meets"),
        (2.0, 2.1, 0.0, False, "got worse by 0.1000 (base 2.0000, fine-tuned 2.1000), which falls short of"),
        (2.5, 2.0, 0.5, True, "which meets the required minimum improvement of 0.5000"),
        (
            2.5,
            2.2,
            0.5,
            False,
            (
                "improved by 0.3000 (base 2.5000, fine-tuned 2.2000), "
                "which falls short of the required minimum improvement of 0.5000"
            ),
        ),
        (2.0, 2.3, -0.5, True, "got worse by 0.3000"),
        (2.0, math.nan, -100.0, False, "not a finite number"),
    ],
)
def test_gate_passes_when_the_loss_improves_by_at_least_the_minimum(base, tuned, minimum, passed, words):
    decision = decide(base, tuned, minimum)
    assert decision.passed is passed
    assert decision.minimum == minimum and decision.measure is EVAL_LOSS
    assert words in decision.reason


@pytest.mark.parametrize(
    ("published", "minimum", "force", "passed", "forced", "words"),
    [
        (1.6, 0.0, False, True, False, "Against the published model (run r1): The eval loss improved by 0.1000"),
        (1.4, 0.0, False, False, False, "got worse by 0.1000 (published 1.4000, new 1.5000), which falls short"),
        (1.55, 0.1, False, False, False, "improved by 0.0500 (published 1.5500, new 1.5000), which falls short of"),
        (1.4, 0.0, True, True, True, "force is set, so the new model is published although it does not beat"),
    ],
)
def test_gate_against_the_published_model(published, minimum, force, passed, forced, words):
    decision = decide_with_published(2.0, 1.5, 0.0, published, minimum, "run r1", force)
    assert (decision.passed, decision.forced) == (passed, forced)
    assert [comparison.against for comparison in decision.comparisons] == ["base", "published"]
    assert decision.reason.startswith("Against the base model: The eval loss improved by 0.5000 (base 2.0000, new")
    assert words in decision.reason


@pytest.mark.parametrize(
    ("tuned", "minimum", "published", "passed", "words"),
    [
        (0.75, 0.05, None, True, "The held-out reward accuracy improved by 0.2500 (base 0.5000, fine-tuned 0.7500)"),
        (0.52, 0.05, None, False, "improved by 0.0200 (base 0.5000, fine-tuned 0.5200), which falls short of"),
        (0.4, 0.0, None, False, "The held-out reward accuracy got worse by 0.1000"),
        (0.75, 0.05, 0.8, False, "Against the published model (run r1): The held-out reward accuracy got worse by"),
        (0.85, 0.05, 0.8, True, "(published 0.8000, new 0.8500), which meets"),
        (12 / 20, 0.1, None, True, "improved by 0.1000 (base 0.5000, fine-tuned 0.6000), which meets"),
        (0.6, 0.05, 0.55, True, "improved by 0.0500 (published 0.5500, new 0.6000), which meets"),
    ],
)
def test_under_dpo_the_gate_compares_the_reward_accuracy_higher_being_better(tuned, minimum, published, passed, words):
    """Objective dpo: the base scores chance, 0.5, and the new model must clear it by the minimum; the published
    model's accuracy, on the same pairs against the same base, must not be beaten."""
    if published is None:
        decision = decide(0.5, tuned, minimum, REWARD_ACCURACY)
    else:
        decision = decide_with_published(0.5, tuned, minimum, published, 0.0, "run r1", False, REWARD_ACCURACY)
    assert decision.passed is passed and decision.measure is REWARD_ACCURACY
    assert words in decision.reason and "eval loss" not in decision.reason


def test_a_benchmark_drop_equal_to_the_maximum_as_written_passes():
    """Six of 40 questions is a drop of 0.15000000000000002 from 20 of 40 in floating point: within 0.15."""
    scores = {
        role: {"task": {"value": value, "higher_is_better": True, "metric": "acc"}}
        for role, value in (("base", 20 / 40), ("fine_tuned", 14 / 40))
    }
    [comparison] = benchmark_comparisons(scores, 0.15)
    assert comparison.passed, comparison.reason
    [beyond] = benchmark_comparisons(scores, 0.149)
    assert not beyond.passed


def test_force_never_overrides_the_base_model_comparison():
    decision = decide_with_published(2.0, 2.5, 0.0, 1.0, 0.0, "run r1", force=True)
    assert not decision.passed and not decision.forced
    assert "force does not override the comparison with the base model" in decision.reason
    unavailable = decide_without_published(2.0, 2.5, 0.0, "its folder is gone")
    assert not unavailable.passed and "folder" not in unavailable.reason
    forced = decide_without_published(2.0, 1.5, 0.0, "its folder is gone")
    assert (
        forced.passed
        and forced.forced
        and "could not be compared (its folder is gone); force is set" in (forced.reason)
    )


def evaluation_with_published() -> dict:
    evaluation = evaluation_for(False)
    published = {"eval_loss": 1.25, "perplexity": math.exp(1.25), "rouge_l": 0.5, "eval_tokens": 100}
    decision = decide_with_published(2.0, 1.5, 0.0, 1.25, 0.0, "run r1", False)
    evaluation |= {
        "published": published,
        "published_model": {"description": "the model card of me/m at commit abc", "run_id": "r1", "revision": "abc"},
        "deltas_vs_published": {"eval_loss": 0.25, "perplexity": math.exp(1.5) - math.exp(1.25), "rouge_l": -0.25},
        "gate": {"passed": False, "forced": False, "min_eval_loss_improvement": 0.0, "reason": decision.reason},
    }
    evaluation["published_model"]["loaded_as"] = "LoRA adapter on org/base"
    return evaluation


def test_reports_show_base_published_and_new_with_the_change_against_each():
    samples = (SampleAnswer("Q <1>", base="b", published="<p>ublished", fine_tuned="new"),)
    evaluation = evaluation_with_published()
    markdown = render_markdown(evaluation, samples, None, None)
    assert "| Metric | Base | Published | New | Change vs base | Change vs published |" in markdown
    assert (
        "| Eval loss (held-out assistant tokens), lower is better | 2.0000 | 1.2500 | 1.5000 | -0.5000 | +0.2500 |"
        in (markdown)
    )
    assert markdown.index("**Base**") < markdown.index("**Published**") < markdown.index("**New**")
    assert "&lt;p&gt;ublished" in markdown and "loaded as LoRA adapter on org/base" in markdown
    html = render_html(evaluation, samples, None, None)
    assert "<th>Base</th><th>Published</th><th>New</th>" in html
    assert "<th colspan=3>1. Q &lt;1&gt;</th></tr><tr><td>b</td><td>&lt;p&gt;ublished</td><td>new</td></tr>" in html
    assert "Against the published model (run r1): The eval loss got worse by 0.2500" in html


def evaluation_for(passed: bool) -> dict:
    entry = {"eval_loss": 2.0, "perplexity": math.exp(2.0), "rouge_l": 0.25, "eval_tokens": 100}
    return {
        "base_model": "base <model>",
        "fine_tuned_model": "/runs/x/train/merged",
        "base": entry,
        "fine_tuned": {**entry, "eval_loss": 1.5, "perplexity": math.exp(1.5)},
        "deltas": {"eval_loss": -0.5, "perplexity": math.exp(1.5) - math.exp(2.0), "rouge_l": 0.0},
        "scored_rows": 3,
        "held_out": {"conversations": 998, "tokenised": 1000, "split_conversations": 4000, "eval_max_rows": 1000},
        "gate": {
            "passed": passed,
            "min_eval_loss_improvement": 0.0,
            "reason": decide(2.0, 1.5 if passed else 2.5, 0.0).reason,
        },
    }


def test_reports_escape_model_output_and_show_the_gate_first():
    samples = (
        SampleAnswer("Is <b>bold</b> & safe?", base="<script>alert(1)</script>", fine_tuned="line one\nline two"),
    )
    html = render_html(evaluation_for(False), samples, None, b"\x89PNG\r\n\x1a\n")
    markdown = render_markdown(evaluation_for(False), samples, None, "loss_curve.png")
    for text in (html, markdown):
        assert "<script>" not in text and "&lt;script&gt;" in text
        assert "Is &lt;b&gt;bold&lt;/b&gt; &amp; safe?" in text
        assert "Quality gate failed" in text and "got worse by 0.5000" in text
        assert "-0.5000" in text and "training_summary.json was not found" in text
        assert (
            "998 held-out conversations: a fixed sample of 1000 of the 4000 in the split (eval_max_rows 1000); "
            "2 have no assistant token within max_length" in text
        )
    assert html.index("Quality gate failed") < html.index("<table>")
    assert "> line one\n> line two" in markdown
    assert 'src="data:image/png;base64,iVBORw' in html
    assert "![Training and eval loss per step](loss_curve.png)" in markdown


def test_html_report_escapes_every_value_but_keeps_its_own_markup():
    """report.html.j2 renders with autoescape: model output stays text, the template's placeholders stay markup."""
    samples = (SampleAnswer('Say "hi" & <go>', base="", fine_tuned="<img src=x onerror=alert(1)> don't"),)
    html = render_html(evaluation_for(True), samples, None, None)
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</body></html>")
    assert "<img" not in html and "<p>No loss curve was found.</p>" in html
    assert "<th colspan=2>1. Say &#34;hi&#34; &amp; &lt;go&gt;</th></tr><tr><td><em>(empty answer)</em></td>" in html
    assert "<td><em>(empty answer)</em></td><td>&lt;img src=x onerror=alert(1)&gt; don&#39;t</td></tr>" in html
    assert '<p class="gate passed">Quality gate passed.' in html


def test_command_line_is_generated_from_the_options():
    flags = {action.option_strings[0] for action in build_parser()._actions if action.option_strings[1:2] != ["--help"]}
    assert flags == {"--" + name.replace("_", "-") for name in EvaluateOptions.__dataclass_fields__}
    options = parse_options(
        [
            "--base-model",
            "b",
            "--fine-tuned-model",
            "t/merged",
            "--data-dir",
            "d",
            "--train-dir",
            "t",
            "--output-dir",
            "o",
            "--extra-questions",
            "How do I tie a bowline?",
            DEFAULT_QUESTIONS[0],
            "--min-eval-loss-improvement",
            "0.05",
        ]
    )
    assert options.questions == [*DEFAULT_QUESTIONS, "How do I tie a bowline?"]
    assert options.min_eval_loss_improvement == 0.05 and options.max_new_tokens == EvaluateOptions.max_new_tokens


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"score_rows": 0}, "score_rows must be at least 1"),
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"min_eval_loss_improvement": math.inf}, "min_eval_loss_improvement must be a finite number"),
        ({"extra_questions": ("  ",)}, "extra_questions holds an empty question"),
    ],
)
def test_bad_options_are_named(changes, message):
    with pytest.raises(UserError, match=message):
        EvaluateOptions(**changes)


def test_component_returns_the_gate_as_parameters_the_dag_can_branch_on(tmp_path):
    """``dsl.If(task.outputs["gate_passed"] == True)`` needs a BOOLEAN output; the UI needs the three artifacts."""
    import yaml
    from kfp import compiler

    from components.pipeline_steps.stages import evaluate_model

    compiler.Compiler().compile(evaluate_model, str(tmp_path / "component.yaml"))
    spec = yaml.safe_load((tmp_path / "component.yaml").read_text())["components"]["comp-evaluate-model"]
    outputs = spec["outputDefinitions"]
    assert outputs["parameters"] == {
        "gate_passed": {"parameterType": "BOOLEAN"},
        "gate_reason": {"parameterType": "STRING"},
    }
    assert {name: artifact["artifactType"]["schemaTitle"] for name, artifact in outputs["artifacts"].items()} == {
        "metrics": "system.Metrics",
        "report_html": "system.HTML",
        "report_markdown": "system.Markdown",
    }
    assert spec["inputDefinitions"]["parameters"]["extra_questions"] == {"parameterType": "LIST"}


def test_the_step_given_a_gpu_stops_when_cuda_does_not_work(capsys):
    """Issue 12, defect 3: the cluster's evaluation step holds a GPU; where CUDA fails it must say so and stop, not
    generate with two models on the CPU. Nothing is read before the check, so the other arguments do not matter."""
    import torch

    from components.evaluate.stage import run_step

    inputs = {"base_model": "base", "train_dir": "train", "data_dir": "data", "tokens_dir": "tokens"}
    inputs |= {"workspace_root": "workspace", "run_id": "run", "repo_id": "", "force": False, "gpus": 1}
    inputs |= {"metrics": None, "report_html": None, "report_markdown": None}
    inputs |= {"mlflow_tracking_uri": "", "mlflow_experiment": "llm-finetune"}
    assert not torch.cuda.is_available()
    with pytest.raises(SystemExit) as exited:
        run_step(inputs)
    assert exited.value.code == 2
    error = " ".join(capsys.readouterr().err.split())
    assert error.startswith("error: The evaluation step was given GPUs, but CUDA is not usable in this pod")


def test_the_base_model_is_loaded_at_the_commit_training_used(monkeypatch, tmp_path):
    """A pinned or moving Hub branch must not change the base under the comparison: the evaluation reads the commit
    the trainer recorded (training_summary.json, base_model_commit) and loads the base model's files at it."""

    import components.evaluate.stage as stage
    from components.evaluate.options import EvaluateOptions

    train_dir = tmp_path / "train"
    (train_dir / "merged").mkdir(parents=True)
    training_summary(base_model_commit="abc123").write(train_dir / "training_summary.json")
    asked = []

    class Stop(Exception):
        pass

    def load_tokenizer(name, revision=None):
        asked.append((str(name), revision))
        if len(asked) == 2:
            raise Stop
        return object()

    monkeypatch.setattr(stage, "check_fine_tuned_dir", lambda path: None)
    monkeypatch.setattr(stage, "load_tokenizer", load_tokenizer)
    options = EvaluateOptions(
        base_model="org/base",
        fine_tuned_model=train_dir / "merged",
        data_dir=tmp_path,
        train_dir=train_dir,
        output_dir=tmp_path / "eval",
    )
    with pytest.raises(Stop):
        stage.evaluate(options)
    assert asked == [(str(train_dir / "merged"), None), ("org/base", "abc123")]


def test_the_reports_say_which_kernels_trained_and_any_speed_fallback():
    fallback = "compiled blocks, flex_attention failed in the rehearsal of the first training step on rank 0 (x)"
    training = training_summary(attention="sdpa", compiled_blocks=False, speed_fallback=fallback)
    evaluation = evaluation_for(True)
    markdown = render_markdown(evaluation, [], training, None)
    assert "- Attention kernel: sdpa" in markdown and "- Compiled blocks: False" in markdown
    assert f"- Speed fallback: {fallback}" in markdown
    assert f"<tr><td>Speed fallback</td><td>{fallback}</td></tr>" in render_html(evaluation, [], training, None)
    assert "Speed fallback" not in render_markdown(
        evaluation, [], dataclasses.replace(training, speed_fallback=None), None
    )


def test_the_base_of_a_published_adapter_is_read_from_its_training_summary(tmp_path):
    """components/evaluate/champion.adapter_base: the published summary names the base and its commit; without
    one the adapter's own record does; one that cannot be read makes the champion unavailable (fail closed)."""
    from components.evaluate.champion import ChampionUnavailable, adapter_base

    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "org/other"}))
    assert adapter_base(tmp_path) == ("org/other", None)
    training_summary("org/base", base_model_commit="c0ffee").write(tmp_path / "training_summary.json")
    assert adapter_base(tmp_path) == ("org/base", "c0ffee")
    (tmp_path / "training_summary.json").write_text(json.dumps({"config": {"model": "org/base"}}))
    with pytest.raises(ChampionUnavailable) as unavailable:
        adapter_base(tmp_path)
    message = str(unavailable.value)
    assert "its training summary has no " in message and "restore the file from the repository's history" in message
    assert "force=true" in message
