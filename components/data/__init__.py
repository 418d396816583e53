"""JSONL → validated chat ``messages`` → train/eval Parquet, in bounded memory."""
