"""The fine-tuning pipeline: its DAG, and the CLIs that compile it and run it locally."""
