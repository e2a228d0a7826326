"""Auto memory: scopes and layout, topic documents, MEMORY.md indexes, recall and forget."""
