"""The one component that is not a stage: a node in the run graph saying which stages were skipped and why."""

from kfp import dsl

from components.runtime_image import runtime_image


@dsl.component(base_image=runtime_image(), install_kfp_package=False)
def report_skipped(skipped: str, reason: str):
    """A node in the run graph that says which stages were skipped and why (the decision's step says it too)."""
    print(f"skipped: {skipped}. Why: {reason}", flush=True)
