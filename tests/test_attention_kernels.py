"""Every attention kernel, and compiled blocks, train the same model on packed rows; no conversation sees another.

Packed rows are built the way training builds them: TRL's padding-free collator over one row of
several conversations (position ids restarting at each), fed to a tiny Llama and to SmolLM2-135M in
fp32 (its real weights, cut to its first ``SMOLLM2_BLOCKS`` blocks: every block is the same code, and
a CPU suite cannot afford thirty). eager is the reference. FlexAttention runs forward only here:
its backward exists only as the Triton kernel torch.compile generates on CUDA ("FlexAttention does
not support backward on CPU"), so its gradients are left to the GPU benchmark's loss curves.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from common.errors import UserError
from trainer import attention, compiled
from trainer.config import TrainConfig
from trainer.distributed import Topology
from trainer.preflight import check_config
from trainer.train import attention_of, load_model, lora_config

SMOLLM2_BLOCKS = 4
CONVERSATIONS = (37, 80, 11, 120, 52)  # tokens of each conversation packed into one row
# fp32 on CPU: the kernels differ only in the order of their sums.
LOSS_TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
GRADIENT_TOLERANCE = {"rtol": 1e-3, "atol": 1e-6}


def packed_batch(vocab: int, lengths=CONVERSATIONS, seed: int = 0) -> dict[str, torch.Tensor]:
    """One padding-free micro-batch of conversations with ``lengths`` tokens, as the trainer's collator makes it."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (sum(lengths),), generator=generator).tolist()
    batch = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)(
        [{"input_ids": ids, "seq_lengths": list(lengths)}]
    )
    return {**batch, "use_cache": False}


def model_with(model_dir, kernel: str, blocks: int | None = None) -> torch.nn.Module:
    cut = {"num_hidden_layers": blocks} if blocks else {}
    return AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation=kernel, dtype=torch.float32, **cut)


def loss_and_gradients(model: torch.nn.Module, batch: dict) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_training(reference: tuple, other: tuple) -> None:
    torch.testing.assert_close(other[0], reference[0], **LOSS_TOLERANCE)
    assert other[1].keys() == reference[1].keys() and reference[1]
    for name, gradient in reference[1].items():
        scale = gradient.abs().max().item()
        torch.testing.assert_close(
            other[1][name], gradient, rtol=GRADIENT_TOLERANCE["rtol"], atol=GRADIENT_TOLERANCE["atol"] + 1e-4 * scale
        )


@pytest.fixture(params=["tiny-llama", "smollm2"])
def model_dir(request, tiny_model_dir, smollm2_dir):
    return {"tiny-llama": tiny_model_dir, "smollm2": smollm2_dir}[request.param]


def test_sdpa_and_flex_compute_eagers_loss_and_sdpa_its_gradients(model_dir):
    blocks = SMOLLM2_BLOCKS if "SmolLM2" in str(model_dir) else None
    reference_model = model_with(model_dir, "eager", blocks)
    batch = packed_batch(reference_model.config.vocab_size)
    reference = loss_and_gradients(reference_model, batch)

    assert_same_training(reference, loss_and_gradients(model_with(model_dir, "sdpa", blocks), batch))
    with torch.no_grad():
        flex_loss = model_with(model_dir, "flex_attention", blocks)(**batch).loss
    torch.testing.assert_close(flex_loss, reference[0], **LOSS_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_name", "method"), [("tiny-llama", "full"), ("tiny-llama", "lora"), ("smollm2", "lora")]
)
def test_compiled_blocks_train_like_eager_blocks(model_name, method, tiny_model_dir, smollm2_dir):
    """Full fine-tuning's gradients (every weight) and LoRA's (the adapters, with the trainer's LoRA settings)."""
    model_dir, blocks = (tiny_model_dir, None) if model_name == "tiny-llama" else (smollm2_dir, SMOLLM2_BLOCKS)
    results = []
    for compile_them in (False, True):
        model = model_with(model_dir, "sdpa", blocks)
        if method == "lora":
            from peft import get_peft_model

            torch.manual_seed(0)
            model = get_peft_model(model, lora_config(TrainConfig(model=str(model_dir))))
        if compile_them:
            assert compiled.compile_blocks(model) == model.config.num_hidden_layers
        results.append(loss_and_gradients(model, packed_batch(model.config.vocab_size)))
    assert_same_training(*results)


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "flex_attention", "sdpa-compiled"])
def test_a_conversation_never_attends_to_another(kernel, tiny_model_dir):
    """Change every token of the first two conversations: the others' logits stay exactly what they were."""
    model = model_with(tiny_model_dir, kernel.removesuffix("-compiled"))
    if kernel.endswith("-compiled"):
        compiled.compile_blocks(model)
    batch = packed_batch(model.config.vocab_size)
    changed = dict(batch, input_ids=batch["input_ids"].clone())
    first_two = sum(CONVERSATIONS[:2])
    changed["input_ids"][0, :first_two] = packed_batch(model.config.vocab_size, seed=1)["input_ids"][0, :first_two]
    with torch.no_grad():
        logits, perturbed = model(**batch).logits[0], model(**changed).logits[0]

    assert not torch.allclose(logits[:first_two], perturbed[:first_two])
    torch.testing.assert_close(perturbed[first_two:], logits[first_two:], rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    ("asked", "packing", "cuda", "compiled", "runs"),
    [
        ("auto", True, True, True, "flex_attention"),
        ("auto", True, True, False, "sdpa"),
        ("auto", False, True, True, "sdpa"),
        ("auto", True, False, False, "sdpa"),
        ("auto", False, False, False, "sdpa"),
        ("sdpa", True, True, True, "sdpa"),
        ("flex_attention", True, True, False, "flex_attention"),
        ("eager", True, False, False, "eager"),
    ],
)
def test_auto_picks_flex_attention_only_for_packed_rows_in_compiled_blocks(
    asked, packing, cuda, compiled, runs, tiny_model_dir, monkeypatch
):
    """Outside compiled blocks flex_attention is compiled on its own, and past that compile's recompile limit runs
    unfused over every S x S score: auto does not pick it there."""
    assert attention.attention_kernel(asked, packing, cuda, compiled) == runs
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    blocks = {} if compiled or not cuda else {"compile_blocks": False}
    config = TrainConfig(model=str(tiny_model_dir), attention=asked, packing=packing, **blocks)
    assert load_model(config, tiny_model_dir, bf16=False).config._attn_implementation == runs


@pytest.mark.parametrize(
    ("sharding", "compile_blocks", "why"),
    [("fsdp", True, "the blocks are not compiled"), ("none", False, "the blocks are not compiled")],
)
def test_auto_says_why_it_left_flex_attention_out(sharding, compile_blocks, why, monkeypatch, tiny_model_dir):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    config = TrainConfig(model=str(tiny_model_dir), sharding=sharding, compile_blocks=compile_blocks)
    assert attention_of(config) == "sdpa"
    reason = attention.why_auto("sdpa", packing=True, cuda=True, blocks_compiled=False)
    assert why in reason and "unfused" in reason


def test_the_log_says_when_packed_attention_is_dense():
    assert "DENSE" in attention.describe("sdpa", packing=True)
    assert "block-sparse" in attention.describe("flex_attention", packing=True)
    assert "DENSE" not in attention.describe("sdpa", packing=False)


def test_flex_attention_without_cuda_is_refused_before_the_model_loads(tiny_model_dir):
    config = TrainConfig(model=str(tiny_model_dir), attention="flex_attention")
    with pytest.raises(UserError) as error:
        check_config(config, Topology(rank=0, local_rank=0, world_size=1))
    assert "--attention flex_attention needs a CUDA GPU and the triton package" in str(error.value)
    assert "use --attention auto" in str(error.value)


@pytest.mark.parametrize(
    ("asked", "cuda", "sharding", "backend", "compiles"),
    [
        (True, True, "none", "inductor", True),
        (True, False, "none", "inductor", False),
        (True, False, "none", "eager", True),
        (True, True, "fsdp", "inductor", False),
        (True, False, "fsdp", "eager", False),
        (False, True, "none", "inductor", False),
    ],
)
def test_blocks_are_compiled_on_cuda_without_fsdp_unless_turned_off(asked, cuda, sharding, backend, compiles):
    """A backend other than inductor generates no code, so it compiles on CPU too (how the tests drive it)."""
    reason = compiled.why_not_compiled(asked, cuda, sharding, backend)
    assert (reason is None) == compiles


@pytest.mark.parametrize("cast_inputs", [False, True], ids=["as-they-come", "cast-to-fp32"])
def test_lora_layers_take_bf16_inputs_as_they_come_unless_asked(cast_inputs, tiny_model_dir):
    """Under bf16 autocast (what the Trainer runs LoRA in on GPUs; the CPU has the same autocast) the adapters see
    the bf16 activations themselves, stay fp32 parameters, and the loss is the one PEFT's fp32 cast gives."""
    from peft import get_peft_model

    from trainer.train import lora_inputs_as_they_come

    config = TrainConfig(model=str(tiny_model_dir), lora_cast_inputs=cast_inputs)
    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16), lora_config(config)
    )
    seen = set()
    adapters = [module for name, module in model.named_modules() if name.endswith("lora_A.default")]
    for adapter in adapters:
        adapter.register_forward_pre_hook(lambda module, inputs: seen.add(inputs[0].dtype))
    batch = packed_batch(model.config.vocab_size)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        with lora_inputs_as_they_come(model, config, mixed_precision=True):
            loss = model(**batch).loss
        assert seen == {torch.float32 if cast_inputs else torch.bfloat16}
        seen.clear()
        peft_default = model(**batch).loss  # outside the context: PEFT's cast
    assert seen == {torch.float32}
    assert {adapter.weight.dtype for adapter in adapters} == {torch.float32}
    torch.testing.assert_close(loss, peft_default, rtol=1e-2, atol=0)


def test_a_compile_failure_ends_the_run_naming_the_switches_that_avoid_compiling(caplog):
    def broken_backend(graph, inputs):
        raise RuntimeError("no compiler for this GPU")

    with pytest.raises(UserError) as error, compiled.compile_failures_explained():
        torch.compile(lambda x: x + 1, backend=broken_backend)(torch.ones(2))
    assert "no compiler for this GPU" in str(error.value)
    assert "compile_blocks false and attention sdpa" in str(error.value)
    assert "Traceback" not in str(error.value) and "torch.compile failed" in caplog.text


def test_the_recompile_limit_is_explained_too():
    """``FailOnRecompileLimitHit`` is a plain ``Exception``, not a ``TorchDynamoException`` (torch 2.11, 2.13)."""

    def add(x):
        return x + 1

    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        with pytest.raises(UserError) as error, compiled.compile_failures_explained():
            compiled_add = torch.compile(add, backend="eager", dynamic=False)
            for dtype in (torch.float32, torch.float64):
                compiled_add(torch.ones(2, dtype=dtype))
    assert "FailOnRecompileLimitHit" in str(error.value)


def test_a_kernel_that_fails_at_its_first_launch_is_explained():
    """Triton's launch errors are often plain RuntimeErrors, raised inside the compiled region."""

    def refusing_backend(graph, inputs):
        def launch(*args):
            raise RuntimeError("Triton Error [CUDA]: out of resource: shared memory")

        return launch

    TritonOutOfResources = type("OutOfResources", (Exception,), {"__module__": "triton.runtime.errors"})
    for failing in (
        lambda: torch.compile(lambda x: x * 2, backend=refusing_backend)(torch.ones(2)),
        lambda: (_ for _ in ()).throw(TritonOutOfResources("out of resource: shared memory")),
    ):
        with pytest.raises(UserError) as error, compiled.compile_failures_explained():
            failing()
        assert "out of resource: shared memory" in str(error.value)


@pytest.mark.parametrize("error", [torch.OutOfMemoryError("CUDA out of memory"), ValueError("a bad row")])
def test_other_failures_pass_through_unexplained(error):
    with pytest.raises(type(error)), compiled.compile_failures_explained():
        raise error
