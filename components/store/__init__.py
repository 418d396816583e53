"""Model storage targets: where a run's model version is kept besides the Hub (S3, an OCI registry)."""
