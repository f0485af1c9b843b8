"""The smallest model the CLI tests train, as train overrides: one place for its shape."""

TINY_MODEL = ["model.embedding_dim=8", "model.bottom_mlp=[16]", "model.top_mlp=[16]"]
