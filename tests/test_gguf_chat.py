"""``python -m gguf_export.chat``: a terminal chat with an exported GGUF, in a real llama.cpp.

The GGUF is SmolLM2-135M-Instruct converted by our converter to f16. (Its q8_0 flips the first greedy token
of the capital-of-France answer, measured: the check below needs the answer transformers gives.)
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys

import pytest
from conftest import REPO_ROOT, run_module
from gguf import GGUFValueType

from gguf_export.convert import convert
from tests.gguf_files import gguf_bytes, key_value


@pytest.fixture(scope="module")
def smollm2_gguf(smollm2_dir, tmp_path_factory):
    return convert(smollm2_dir, tmp_path_factory.mktemp("chat") / "smollm2-f16.gguf", "f16").path


def test_prompt_answers_once_with_only_the_answer_on_stdout(smollm2_gguf):
    """--prompt is for scripts: the model's words on stdout, nothing from llama.cpp on either stream."""
    result = run_module(
        "gguf_export.chat", smollm2_gguf, "--prompt", "What is the capital of France?", "--temperature", "0"
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout and result.stderr == ""
    assert "llama" not in result.stdout and "<|im_" not in result.stdout  # no logging, the template's tokens stripped


def test_interactive_chat_answers_each_line_until_exit(smollm2_gguf):
    """One reply per message, /reset answers nothing, /exit ends with status 0 and reads no further."""
    lines = "Hello!\nName a colour.\n/reset\nName a fruit.\n/exit\nnever read\n"
    result = subprocess.run(
        [sys.executable, "-m", "gguf_export.chat", str(smollm2_gguf), "--temperature", "0", "--max-tokens", "24"],
        input=lines,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    replies = [part.split("\nyou> ")[0].strip() for part in result.stdout.split("model> ")[1:]]
    assert len(replies) == 3 and all(replies)
    assert result.stderr.startswith("chatting with smollm2-f16.gguf")


class RecordingModel:
    """Stands in for llama.cpp to see what the chat sends it: the conversation so far, each time."""

    def __init__(self):
        self.sent = []

    def create_chat_completion(self, messages, **settings):
        self.sent.append([dict(message) for message in messages])
        return iter([{"choices": [{"delta": {"content": f"reply {len(self.sent)}"}}]}])


def test_each_reply_sees_the_earlier_turns_and_reset_forgets_them(monkeypatch, capsys):
    from gguf_export import chat

    model = RecordingModel()
    typed = iter(["Hi", "And?", "/reset", "Again", "/exit"])
    monkeypatch.setattr("builtins.input", lambda prompt: next(typed))
    chat.chat(model, chat.parse_args(["m.gguf", "--system", "Be brief."]))
    system = {"role": "system", "content": "Be brief."}
    assert model.sent == [
        [system, {"role": "user", "content": "Hi"}],
        [
            system,
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "reply 1"},
            {"role": "user", "content": "And?"},
        ],
        [system, {"role": "user", "content": "Again"}],
    ]
    assert capsys.readouterr().out.count("model> ") == 3


def test_the_embedded_template_is_required(gguf_models, tmp_path):
    """Without tokenizer.chat_template there is no right way to render a turn: refused, not guessed."""
    model = tmp_path / "no-template"
    shutil.copytree(gguf_models["qwen3"], model)
    (model / "chat_template.jinja").unlink()
    plain = convert(model, tmp_path / "plain.gguf", "f16").path
    result = run_module("gguf_export.chat", plain, "--prompt", "hi")
    # The paragraph is wrapped at 100 columns, and where depends on the length of the temporary path.
    assert result.returncode == 2 and "has no chat template" in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.gguf", None, "does not exist"),
        ("notes.gguf", b"not a model\n", "is not a GGUF file llama.cpp can read: it starts with b'not '"),
        (
            "aligned-to-0.gguf",
            gguf_bytes([key_value("general.alignment", GGUFValueType.UINT32, struct.pack("<I", 0))], []),
            "is not a GGUF file llama.cpp can read: general.alignment is 0, not a power of two",
        ),
    ],
)
def test_a_bad_path_gets_one_paragraph(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    result = run_module("gguf_export.chat", path, "--prompt", "hi")
    assert result.returncode == 2 and message in " ".join(result.stderr.split()) and "Traceback" not in result.stderr
