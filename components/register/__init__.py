"""Model Registry registration: each version that passed the gate, where it went, and how it came to be."""
