"""Which attention kernel a rank runs, and what it computes for packed rows.

Packed training rows hold several conversations, told apart by their position ids
(padding-free: one row per micro-batch, no attention mask). transformers turns the
position ids into a block-diagonal mask (``masking_utils.find_packed_sequence_indices``):

- sdpa gets that mask as a dense (1, 1, S, S) tensor, which rules out its flash kernel: the
  memory-efficient (GPU) or math (CPU) kernel computes every pair of the row's S tokens, nearly
  all of them masked out when conversations are short;
- flex_attention gets it as a ``BlockMask`` and skips every 128 x 128 block with no pair of one
  conversation's tokens: its cost grows with the conversations' lengths, not the row's. PyTorch's
  FlexAttention announcement measured it at about 90% of FlashAttention-2's forward and 85% of its
  backward speed on A100s for causal masks, and block-sparse masks such as document masking
  gaining over dense masked SDPA in proportion to the blocks skipped
  (https://pytorch.org/blog/flexattention/); torchtune trains its packed rows with it whenever
  it is available (``torchtune.modules.attention_utils``);
- flash_attention_2 (the flash-attn package) reads the conversations' boundaries from the
  position ids and runs its variable-length kernel.

FlexAttention's backward runs only as the Triton kernel torch.compile generates on CUDA
(torch 2.13 on CPU: "FlexAttention does not support backward on CPU"). ``auto`` picks it only where
it runs inside compiled blocks (CUDA, packed rows, ``compile_blocks``, no FSDP): there it is part of
each block's graph, rehearsed before the first step (``trainer.rehearsal``). Anywhere else
transformers compiles it on its own, and past that compile's recompile limit it silently runs
unfused, materialising every row's S x S scores (vllm-project/vllm#27178), so ``auto`` picks sdpa.
"""

from __future__ import annotations

AUTO = "auto"
# The tile FlexAttention computes or skips as a whole (torch.nn.attention.flex_attention._DEFAULT_SPARSE_BLOCK_SIZE).
FLEX_BLOCK = 128


def attention_kernel(asked: str, packing: bool, cuda: bool, blocks_compiled: bool) -> str:
    """The ``attn_implementation`` a run loads its model with: ``asked``, or for ``auto`` the best one proven here."""
    if asked != AUTO:
        return asked
    return "flex_attention" if cuda and packing and blocks_compiled else "sdpa"


def why_auto(kernel: str, packing: bool, cuda: bool, blocks_compiled: bool) -> str:
    """Why ``auto`` chose ``kernel``: the reason the log gives beside the kernel's name."""
    if kernel == "flex_attention":
        return "attention auto: packed rows on CUDA inside compiled blocks"
    if not packing:
        return "attention auto: unpacked rows"
    if not cuda:
        return "attention auto: flex_attention has no backward on CPU"
    return (
        "attention auto: the blocks are not compiled, and flex_attention compiled on its own silently runs unfused "
        "(every S x S score) past torch.compile's recompile limit"
    )


def describe(kernel: str, packing: bool) -> str:
    """One log line saying which kernel runs and what it computes, so a slow run can be explained from its log."""
    if kernel == "flex_attention":
        return (
            "attention: flex_attention, block-sparse: only the 128x128 blocks holding token pairs of one "
            "conversation are computed"
        )
    if kernel == "flash_attention_2":
        return "attention: flash_attention_2, variable-length kernel over each conversation"
    if not packing:
        return f"attention: {kernel}, causal over each padded row"
    return (
        f"attention: {kernel} with packed rows: a DENSE block-diagonal mask, every pair of a row's tokens is "
        "computed and most are masked out"
    )
