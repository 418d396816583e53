"""Options built from a component's inputs: how every KFP component hands its inputs to its stage."""

from dataclasses import dataclass
from pathlib import Path

import pytest

from common.cli_options import option, options_from_inputs, run_option
from components.data.options import PrepareOptions


@dataclass(frozen=True)
class Example:
    questions: tuple[str, ...] = run_option((), "Questions.")
    limit: int = run_option(3, "A limit.")
    output_dir: Path = option(Path(), "Where the stage writes.", required=True)


def test_fields_come_from_inputs_by_name_and_derived_ones_win():
    inputs = {"questions": ["a", "b"], "limit": 7, "output_dir": "ignored", "metrics": object()}
    options = options_from_inputs(Example, inputs, output_dir=Path("/run/evaluate"))
    assert options == Example(questions=("a", "b"), limit=7, output_dir=Path("/run/evaluate"))


def test_a_field_the_component_does_not_take_keeps_its_default():
    assert options_from_inputs(Example, {"output_dir": Path("out")}).limit == 3


def test_the_options_own_validation_still_runs():
    """A stage gets its options the same way from the CLI and from KFP, so a bad value fails the same way."""
    with pytest.raises(Exception, match="eval_fraction"):
        options_from_inputs(PrepareOptions, {"eval_fraction": 1.5})
