"""Check a GGUF file against the checkpoint it came from, in llama.cpp.

Two levels, both needed before a file is published:

1. The file read back (``gguf_export.reader``): architecture, tensor count and
   shapes, the vocabulary equal to the Hugging Face tokenizer's, the chat
   template present and equal.
2. The file loaded in llama.cpp (llama-cpp-python) and compared with
   transformers on the same token ids: tokenisation of plain and
   chat-templated prompts, logits at every position of at least
   ``min_positions`` tokens (NMSE and top-1 agreement against thresholds that
   depend on the output type), and a greedy chat reply that must stop at the
   end-of-turn token where transformers' does.

This module runs the checks; ``verification_report`` holds their outcome and
renders it. It imports torch and transformers (the reference side); the
conversion path does not.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

from common.errors import UserError
from gguf_export.chat_formats import chat_format_of
from gguf_export.convert import ConversionResult
from gguf_export.options import Thresholds
from gguf_export.reader import read_gguf
from gguf_export.verification_report import VerificationReport

REPLY_TOKENS = 48

PLAIN_PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "In 2024, 3.14159 x 2 = 6.28318 and 1,000,000 apples cost $12.50!",
    "def add(a, b):\n    return a + b  # sum of two numbers\n",
    "Ünïcödé naïve café: 東京 🚀   spaced   out\t\ttabs and 'quotes' I'll we've",
)

CONVERSATIONS = (
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
    ],
    [
        {"role": "system", "content": "You are a concise assistant for home repairs."},
        {"role": "user", "content": "How do I fix a dripping tap?"},
        {
            "role": "assistant",
            "content": (
                "Turn off the water supply, remove the handle, replace the worn washer or cartridge, "
                "then reassemble and test."
            ),
        },
    ],
    [
        {"role": "user", "content": "Write a Python function that reverses a string."},
        {"role": "assistant", "content": "def reverse(text):\n    return text[::-1]"},
    ],
    [
        {"role": "user", "content": "How should I store fresh herbs?"},
        {
            "role": "assistant",
            "content": (
                "Wrap soft herbs in a damp paper towel and keep them in the fridge; "
                "keep basil in water at room temperature."
            ),
        },
    ],
    [
        {"role": "user", "content": "Tie a bowline knot: what are the steps?"},
        {
            "role": "assistant",
            "content": (
                "Make a small loop, pass the end up through it, around the standing part, "
                "and back down through the loop. Pull tight."
            ),
        },
    ],
    [
        {"role": "user", "content": "Explain in one sentence why the sky is blue."},
        {
            "role": "assistant",
            "content": (
                "Air molecules scatter short blue wavelengths of sunlight much more than red ones, "
                "so blue light reaches us from every direction."
            ),
        },
    ],
)
REPLY_CONVERSATION = [{"role": "user", "content": "What is the capital of France?"}]


class TransformersReference:
    """The Hugging Face checkpoint as ground truth: tokenizer, template, logits, greedy reply.

    The model is loaded once, in float32, and its results are cached, so
    verifying several output types of one checkpoint costs one reference run.
    """

    def __init__(self, model_dir: Path, min_positions: int) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.min_positions = min_positions
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.chat_format = chat_format_of(self.tokenizer.chat_template)

    @cached_property
    def model(self):
        import torch
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()

    def render(self, messages: Sequence[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=generation_prompt
        )

    def encode_chat(self, messages: Sequence[dict], generation_prompt: bool = False) -> list[int]:
        return self.tokenizer(self.render(messages, generation_prompt), add_special_tokens=False)["input_ids"]

    @cached_property
    def evaluation_ids(self) -> list[int]:
        """Chat-templated conversations (plain text without a template), cycled until at least
        ``min_positions`` tokens."""
        ids: list[int] = []
        index = 0
        while len(ids) < self.min_positions:
            conversation = CONVERSATIONS[index % len(CONVERSATIONS)]
            if self.tokenizer.chat_template:
                ids += self.encode_chat(conversation)
            else:
                ids += self.tokenizer(" ".join(m["content"] for m in conversation), add_special_tokens=False)[
                    "input_ids"
                ]
            index += 1
        return ids

    @cached_property
    def logits(self) -> np.ndarray:
        import torch

        with torch.inference_mode():
            return self.model(torch.tensor([self.evaluation_ids])).logits[0].float().numpy()

    @cached_property
    def stop_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        if self.chat_format is not None:
            ids.add(self.tokenizer.convert_tokens_to_ids(self.chat_format.end_of_turn))
        return sorted(i for i in ids if i is not None)

    @cached_property
    def reply(self) -> list[int]:
        """transformers' greedy reply to REPLY_CONVERSATION, stop token included when it stopped."""
        import torch

        prompt = self.encode_chat(REPLY_CONVERSATION, generation_prompt=True)
        with torch.inference_mode():
            output = self.model.generate(
                torch.tensor([prompt]),
                max_new_tokens=REPLY_TOKENS,
                do_sample=False,
                eos_token_id=self.stop_ids,
                pad_token_id=self.stop_ids[0],
            )
        return output[0, len(prompt) :].tolist()


def nmse_and_top1(candidate: np.ndarray, reference: np.ndarray) -> tuple[float, float, float]:
    """Mean and max per-position NMSE, and the share of positions with the same argmax."""
    per_position = ((candidate - reference) ** 2).sum(axis=-1) / (reference**2).sum(axis=-1)
    top1 = float((candidate.argmax(axis=-1) == reference.argmax(axis=-1)).mean())
    return float(per_position.mean()), float(per_position.max()), top1


def open_llama(path: Path, n_ctx: int, lora_path: Path | None = None):
    try:
        from llama_cpp import Llama
    except ImportError:
        raise UserError(
            "Verification loads the GGUF in llama.cpp, which needs llama-cpp-python, a dependency of this project "
            "that is not installed here: pip install llama-cpp-python (it builds llama.cpp, which takes a few minutes)."
        ) from None
    try:
        # One thread for single-token steps (spinning OpenMP workers cost more than they give a
        # small model on a busy machine), every core for the batched prompt evaluations.
        return Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_batch=512,
            logits_all=True,
            verbose=False,
            n_threads=1,
            n_threads_batch=os.cpu_count(),
            lora_path=str(lora_path) if lora_path else None,
        )
    except (ValueError, RuntimeError) as error:
        return error


def check_file(
    report: VerificationReport,
    path: Path,
    reference: TransformersReference,
    expected: dict[str, tuple[int, ...]] | None,
    arch: str | None,
) -> None:
    """Level 1: the file as written, read back."""
    written = read_gguf(path)
    fields = written.metadata
    written_arch = fields.get("general.architecture")
    report.add(
        "architecture",
        written_arch is not None and (arch is None or written_arch == arch),
        "missing (general.architecture)"
        if written_arch is None
        else f"{written_arch}" + ("" if arch is None or written_arch == arch else f", expected {arch}"),
    )
    shapes = {tensor.name: tensor.shape for tensor in written.tensors}
    if expected is not None:
        wrong = sorted(name for name in expected if shapes.get(name) != expected[name])
        extra = sorted(set(shapes) - set(expected))
        report.add(
            "tensors",
            not wrong and not extra,
            f"{len(shapes)} tensors"
            + (f"; wrong or missing: {', '.join(wrong[:5])}" if wrong else "")
            + (f"; unexpected: {', '.join(extra[:5])}" if extra else ""),
        )
    tokens = fields.get("tokenizer.ggml.tokens", [])
    vocab = reference.tokenizer.get_vocab()
    added = set(reference.tokenizer.get_added_vocab())
    mismatched = [
        text
        for text, token_id in vocab.items()
        if text not in added and (token_id >= len(tokens) or tokens[token_id] != text)
    ]
    report.add(
        "vocabulary",
        not mismatched,
        f"{len(tokens)} tokens"
        + (
            f"; {len(mismatched)} differ from the tokenizer, e.g. {mismatched[:3]}"
            if mismatched
            else ", equal to the tokenizer's"
        ),
    )
    template = fields.get("tokenizer.chat_template")
    report.add(
        "chat_template",
        template is not None and template == reference.tokenizer.chat_template,
        "present and equal to the tokenizer's"
        if template == reference.tokenizer.chat_template
        else "missing or different",
    )
    report.metrics["tensor_count"] = len(shapes)
    report.metrics["vocabulary_size"] = len(tokens)


def check_tokenisation(report: VerificationReport, llm, reference: TransformersReference) -> None:
    plain_ok = 0
    for text in PLAIN_PROMPTS:
        plain_ok += llm.tokenize(text.encode(), add_bos=True, special=False) == reference.tokenizer(text)["input_ids"]
    report.add(
        "plain_tokens",
        plain_ok == len(PLAIN_PROMPTS),
        f"{plain_ok}/{len(PLAIN_PROMPTS)} plain prompts tokenised identically",
    )
    if not reference.tokenizer.chat_template:
        report.add("chat_tokens", False, "the checkpoint has no chat template to tokenise conversations with")
        return
    chat_ok = 0
    for messages in CONVERSATIONS:
        rendered = reference.render(messages, generation_prompt=False)
        chat_ok += llm.tokenize(rendered.encode(), add_bos=False, special=True) == reference.encode_chat(messages)
    report.add(
        "chat_tokens",
        chat_ok == len(CONVERSATIONS),
        f"{chat_ok}/{len(CONVERSATIONS)} chat-templated conversations tokenised identically",
    )


def check_logits(
    report: VerificationReport, llm, reference: TransformersReference, min_top1: float, max_nmse: float
) -> None:
    ids = reference.evaluation_ids
    llm.reset()
    llm.eval(ids)
    candidate = np.array(llm.scores[: len(ids)], dtype=np.float32)
    nmse, worst, top1 = nmse_and_top1(candidate, reference.logits)
    report.metrics.update({"positions": len(ids), "nmse": nmse, "nmse_max": worst, "top1_agreement": top1})
    report.add(
        "positions",
        len(ids) >= reference.min_positions,
        f"{len(ids)} positions compared (at least {reference.min_positions})",
    )
    report.add("top1_agreement", top1 >= min_top1, f"{top1:.2%} (threshold {min_top1:.0%})")
    report.add("nmse", nmse < max_nmse, f"{nmse:.3g} (threshold {max_nmse:g}; worst position {worst:.3g})")


def greedy_reply(llm, prompt: list[int], max_tokens: int) -> tuple[list[int], bool]:
    """llama.cpp's greedy continuation and whether it ended on an end-of-generation token."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    llm.reset()
    llm.eval(prompt)
    reply: list[int] = []
    for _ in range(max_tokens):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        reply.append(token)
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            return reply, True
        llm.eval([token])
    return reply, False


def check_reply(report: VerificationReport, llm, reference: TransformersReference) -> None:
    """The chat turn ends where it should: the end-of-turn token is end-of-generation, and predicted.

    transformers' greedy reply is fed to llama.cpp (teacher forcing) and llama.cpp
    must pick an end-of-generation token right where transformers stopped: a
    wrong EOS/EOT or a lost template fails here. llama.cpp's own free-running
    greedy reply is recorded too; with quantised weights it may legitimately
    take another path after a near-tie, so it informs rather than decides.
    """
    import llama_cpp

    fmt = reference.chat_format
    if fmt is None:
        report.add(
            "end_of_turn",
            False,
            "the tokenizer's chat template is not a known format, so its end-of-turn token is unknown",
        )
        return
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    end_of_turn = reference.tokenizer.convert_tokens_to_ids(fmt.end_of_turn)
    is_eog = llama_cpp.llama_vocab_is_eog(vocab, end_of_turn)
    report.add(
        "end_of_turn",
        is_eog,
        f"{fmt.end_of_turn} (id {end_of_turn}) {'ends' if is_eog else 'does NOT end'} generation in llama.cpp",
    )
    prompt = reference.encode_chat(REPLY_CONVERSATION, generation_prompt=True)
    expected = reference.reply
    if expected and expected[-1] in reference.stop_ids:
        llm.reset()
        llm.eval(prompt + expected[:-1])
        predicted = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        stops = llama_cpp.llama_vocab_is_eog(vocab, predicted)
        shown = reference.tokenizer.convert_ids_to_tokens(predicted)
        report.add(
            "reply_stops",
            stops,
            (
                f"after transformers' {len(expected) - 1}-token greedy reply llama.cpp predicts {shown!r}, "
                f"{'an' if stops else 'NOT an'} end-of-generation token"
            ),
        )
    else:
        report.add(
            "reply_stops",
            True,
            (
                f"not applicable: transformers' own greedy reply does not end its turn within {REPLY_TOKENS} tokens "
                "(untrained weights)"
            ),
        )
    reply, stopped = greedy_reply(llm, prompt, REPLY_TOKENS)
    report.metrics.update(
        {
            "reply": reference.tokenizer.decode(reply, skip_special_tokens=False),
            "reply_stopped": stopped,
            "reply_max_tokens": REPLY_TOKENS,
            "reply_equals_transformers": reply == expected,
        }
    )


def verify(
    path: Path,
    reference: TransformersReference,
    outtype: str,
    thresholds: Thresholds,
    expected_shapes: dict[str, tuple[int, ...]] | None = None,
    arch: str | None = None,
) -> VerificationReport:
    """Every check for one GGUF file; ``report.passed`` is the verdict."""
    report = VerificationReport(gguf=str(path), outtype=outtype)
    min_top1, max_nmse = thresholds.for_outtype(outtype)
    report.metrics["thresholds"] = {
        "min_top1": min_top1,
        "max_nmse": max_nmse,
        "min_positions": thresholds.min_positions,
    }
    check_file(report, path, reference, expected_shapes, arch)
    llm = open_llama(path, n_ctx=max(512, len(reference.evaluation_ids) + REPLY_TOKENS + 64))
    if isinstance(llm, Exception):
        report.add("loads_in_llama_cpp", False, f"llama.cpp cannot load the file: {llm}")
        return report
    try:
        report.add("loads_in_llama_cpp", True, "loaded by llama-cpp-python")
        check_tokenisation(report, llm, reference)
        check_logits(report, llm, reference, min_top1, max_nmse)
        check_reply(report, llm, reference)
    finally:
        llm.close()
    return report


def verify_conversion(
    result: ConversionResult, reference: TransformersReference, thresholds: Thresholds
) -> VerificationReport:
    """``verify`` for a file this package just wrote: its shapes and architecture are checked too
    (none for delegated files)."""
    written_here = bool(result.tensor_shapes)
    return verify(
        result.path,
        reference,
        result.outtype,
        thresholds,
        result.tensor_shapes if written_here else None,
        result.architecture if written_here else None,
    )


def verify_adapter(
    adapter: Path, merged_gguf: Path, base_gguf: Path | None, reference: TransformersReference, max_nmse: float
) -> VerificationReport:
    """The LoRA adapter loads on top of a GGUF; with the base model, base+adapter matches the merged model."""
    report = VerificationReport(gguf=str(adapter), outtype="lora")
    n_ctx = max(512, len(reference.evaluation_ids) + 64)
    target = base_gguf or merged_gguf
    llm = open_llama(target, n_ctx, lora_path=adapter)
    if isinstance(llm, Exception):
        report.add("adapter_loads", False, f"llama.cpp cannot apply the adapter to {target.name}: {llm}")
        return report
    report.add("adapter_loads", True, f"applied to {target.name} by llama.cpp")
    if base_gguf is None:
        llm.close()
        report.add(
            "adapter_matches_merged",
            True,
            (
                "not checked: the base model is not available locally, "
                "so base+adapter cannot be compared with the merged model"
            ),
        )
        return report
    ids = reference.evaluation_ids
    try:
        llm.eval(ids)
        with_adapter = np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()
    merged = open_llama(merged_gguf, n_ctx)
    try:
        merged.eval(ids)
        merged_logits = np.array(merged.scores[: len(ids)], dtype=np.float32)
    finally:
        merged.close()
    nmse, worst, top1 = nmse_and_top1(with_adapter, merged_logits)
    report.metrics.update({"nmse_vs_merged": nmse, "top1_vs_merged": top1, "positions": len(ids)})
    report.add(
        "adapter_matches_merged",
        nmse < max_nmse,
        f"base+adapter vs merged model in llama.cpp: NMSE {nmse:.3g} (threshold {max_nmse:g}), top-1 {top1:.2%}",
    )
    return report
