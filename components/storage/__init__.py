"""Model storage targets: where a run's model is kept besides the Hub (S3, an OCI modelcar image)."""
