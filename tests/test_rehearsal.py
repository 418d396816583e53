"""trainer/rehearsal.py's rows: the lengths that leave flex_attention's block mask and Inductor's length ranges
nothing to compile mid-run.

transformers builds a packed row's ``BlockMask`` with ``create_block_mask(..., _compile=True)``, which is
``torch.compile(create_block_mask)``: not dynamic, so its first graph is for the first batch's length, a second
length makes the length symbolic, and a row of one 128-token tile gets a graph of its own (dynamo specialises a
dimension of size 1). With rows cut at one tile alone, the first training batch of another length compiled a graph
mid-run on an H100 on 2026-11-27. dynamo's guards are the same with any backend, so a counting backend on CPU shows
the same graphs as Inductor on a GPU.

Inductor's ranges (a graph guarded on 128-2,559 tokens, another on 4,096 and up, on an H200 on 2026-11-28) come
from its code generation, which a CPU backend does not run; a compiled function that branches on the length where
Inductor's code does stands in for them: dynamo guards each graph on the side of the branch it took, as Inductor
guards each on its range.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import datasets
import pytest
import torch
import torch._dynamo
from torch.nn.attention.flex_attention import create_block_mask

from trainer import compiled
from trainer.rehearsal import cut_rows, micro_batches_by_length

FIRST_ROW = 1024  # tokens in the data's first (packed) row


@pytest.fixture
def count_block_mask_graphs() -> Iterator[tuple[Callable[[list[int]], None], list[int]]]:
    """``build(seq_lengths)`` makes the block mask of one row of those conversations as transformers does (causal
    alone for one conversation, causal and same-conversation for several); every graph dynamo compiles is counted."""
    graphs: list[int] = []

    def counting_backend(graph_module: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(len(graph_module.graph.nodes))
        return graph_module.forward

    compiled_create = torch.compile(create_block_mask, backend=counting_backend)

    def causal(batch, head, q_index, kv_index):
        return q_index >= kv_index

    def build(seq_lengths: list[int]) -> None:
        conversation = torch.repeat_interleave(torch.arange(len(seq_lengths)), torch.tensor(seq_lengths))[None]

        def causal_in_one_conversation(batch, head, q_index, kv_index):
            return causal(batch, head, q_index, kv_index) & (
                conversation[batch, q_index] == conversation[batch, kv_index]
            )

        mask = causal if len(seq_lengths) == 1 else causal_in_one_conversation
        length = sum(seq_lengths)
        compiled_create(mask, 1, None, length, length, device="cpu")

    torch._dynamo.reset()
    yield build, graphs
    torch._dynamo.reset()


def test_cut_rows_are_one_and_two_tiles_each_as_one_conversation_and_two():
    row = {"input_ids": list(range(FIRST_ROW))}
    tile = compiled.PAD_MULTIPLE
    assert [batch[0]["seq_lengths"] for batch in cut_rows(row)] == [
        [tile],
        [tile // 2, tile // 2],
        [2 * tile],
        [tile, tile],
    ]
    for batch in cut_rows(row):
        assert batch[0]["input_ids"] == batch[0]["labels"] == row["input_ids"][: sum(batch[0]["seq_lengths"])]

    short = {"input_ids": list(range(tile + 10))}  # reaches into a second tile only: cut where it ends
    assert [batch[0]["seq_lengths"] for batch in cut_rows(short)] == [[tile], [64, 64], [tile + 10], [69, 69]]
    tiny = {"input_ids": list(range(40))}
    assert [batch[0]["seq_lengths"] for batch in cut_rows(tiny)] == [[40], [20, 20]]


def test_after_the_rehearsals_rows_no_row_length_compiles_a_block_mask(count_block_mask_graphs):
    build, graphs = count_block_mask_graphs
    first = [300, 400, FIRST_ROW - 700]
    for seq_lengths in [first, *(batch[0]["seq_lengths"] for batch in cut_rows({"input_ids": [0] * FIRST_ROW}))]:
        build(seq_lengths)
    rehearsed = len(graphs)

    for seq_lengths in ([100, 284], [500, 396], [128], [60, 68], [640], [FIRST_ROW]):
        build(seq_lengths)
    assert len(graphs) == rehearsed


def test_one_tile_cuts_alone_leave_longer_rows_a_graph_to_compile(count_block_mask_graphs):
    """Why the two-tile cuts are there: without them a packed row of a new length compiles during training."""
    build, graphs = count_block_mask_graphs
    for seq_lengths in ([300, 400, FIRST_ROW - 700], [128], [64, 64]):
        build(seq_lengths)
    rehearsed = len(graphs)

    build([100, 284])
    assert len(graphs) == rehearsed + 1


def test_one_row_of_each_padded_length_is_found_from_the_offsets_shortest_first():
    tile = compiled.PAD_MULTIPLE
    lengths = [4 * tile, 5, tile + 2, tile + 12, 3 * tile, 2 * tile, tile, 4 * tile - 1]
    rows = datasets.Dataset.from_dict({"input_ids": [[7] * length for length in lengths]})
    # the longest row of 1 tile (row 6), 2 tiles (row 5), 3 (row 4), 4 (row 0), each alone
    assert micro_batches_by_length(rows) == [(6, 1), (5, 1), (4, 1), (0, 1)]
    # through an index mapping, as after a shuffle
    assert micro_batches_by_length(rows.select([3, 6, 0])) == [(1, 1), (0, 1), (2, 1)]

    many = datasets.Dataset.from_dict({"input_ids": [[7] * (n * tile) for n in range(1, 101)]})
    # spread: the shortest and the longest always
    assert micro_batches_by_length(many, limit=4) == [(0, 1), (33, 1), (66, 1), (99, 1)]


def test_with_several_rows_per_micro_batch_the_joined_lengths_are_rehearsed_too():
    """Padding-free micro-batches of 2 rows are one sequence of both rows' tokens, padded as a whole: rows of 1 and 3
    tiles make micro-batches of 2 to 6 tiles, which the rows alone never reach."""
    tile = compiled.PAD_MULTIPLE
    rows = datasets.Dataset.from_dict({"input_ids": [[7] * tile, [7] * (3 * tile - 50)]})
    assert micro_batches_by_length(rows, rows_per_batch=2) == [(0, 1), (0, 2), (1, 1), (1, 2)]  # 1, 2, 3, 6 tiles
    assert micro_batches_by_length(rows, rows_per_batch=2, limit=3) == [(0, 1), (1, 1), (1, 2)]  # 1, 3, 6 tiles


@pytest.fixture
def count_ranged_graphs() -> Iterator[tuple[Callable[[int], None], list[int]]]:
    """``run(length)`` calls a block compiled as the trainer compiles one (``dynamic=True``) whose code differs below
    2,560 tokens and from 4,096 up, the ranges Inductor cut the H200's length into; every graph is counted."""
    graphs: list[int] = []

    def counting_backend(graph_module: torch.fx.GraphModule, example_inputs: list) -> Callable:
        graphs.append(len(graph_module.graph.nodes))
        return graph_module.forward

    def block(hidden: torch.Tensor) -> torch.Tensor:
        if hidden.size(1) < 2560:  # flex_attention's decoding kernel is considered
            hidden = hidden * 2
        if hidden.size(1) >= 4096:  # 64-bit indexing
            hidden = hidden + 1
        return hidden.sum()

    compiled_block = torch.compile(block, backend=counting_backend, dynamic=True)
    torch._dynamo.reset()
    yield (lambda length: compiled_block(torch.ones(1, length, 4))), graphs
    torch._dynamo.reset()


def test_rows_of_every_length_leave_no_length_range_to_compile_mid_run(count_ranged_graphs):
    run, graphs = count_ranged_graphs
    tile, longest = compiled.PAD_MULTIPLE, 4096
    data = datasets.Dataset.from_dict({"input_ids": [[7] * n for n in (longest, 3000, 700, longest, 2900, 130)]})
    first = [longest]
    cuts = [sum(batch[0]["seq_lengths"]) for batch in cut_rows({"input_ids": [0] * longest})]

    for length in (*first, *cuts):  # the rehearsal before the rows of each length
        run(length)
    before_lengths = len(graphs)
    run(3072)  # a packed row of about 3,000 tokens, padded: the H200's step 8
    assert len(graphs) == before_lengths + 1

    torch._dynamo.reset()
    graphs.clear()
    for length in (*first, *cuts, *micro_batch_lengths(data, 1)):
        run(length)
    rehearsed = len(graphs)
    for length in range(tile, longest + 1, tile):  # every padded length a row of this data can have
        run(length)
    assert len(graphs) == rehearsed


def micro_batch_lengths(data: datasets.Dataset, rows_per_batch: int) -> list[int]:
    """The padded lengths of the micro-batches ``micro_batches_by_length`` picks."""
    tile = compiled.PAD_MULTIPLE
    picked = micro_batches_by_length(data, rows_per_batch)
    return [-(-copies * len(data[i]["input_ids"]) // tile) * tile for i, copies in picked]


def test_micro_batches_of_two_rows_leave_no_length_range_to_compile_mid_run(count_ranged_graphs):
    """Rows of up to 2,048 tokens, two per micro-batch: the micro-batches reach 4,096 tokens, the 64-bit indexing
    range no row alone reaches."""
    run, graphs = count_ranged_graphs
    tile, longest = compiled.PAD_MULTIPLE, 2048
    # 1,921 tokens pad to 2,048 too, but two of them make 3,968: only the longest row of that length reaches 4,096
    data = datasets.Dataset.from_dict({"input_ids": [[7] * n for n in (1921, longest, 1500, 700, 130)]})
    for length in micro_batch_lengths(data, 1):
        run(length)
    alone = len(graphs)
    run(2 * longest)  # two of the longest rows in one micro-batch
    assert len(graphs) == alone + 1

    torch._dynamo.reset()
    graphs.clear()
    for length in micro_batch_lengths(data, 2):
        run(length)
    rehearsed = len(graphs)
    for length in range(tile, 2 * longest + 1, tile):  # every padded length a micro-batch of this data can have
        run(length)
    assert len(graphs) == rehearsed
