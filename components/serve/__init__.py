"""Serving handoff: a KServe InferenceService (vLLM) for the stored version, rendered, or deployed and tried."""
