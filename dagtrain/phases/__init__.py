"""The work behind the operators: data prep, the training phase, round-based sync,
evaluation and the model registry. Torch is imported inside functions only."""
