"""Sessions: the per-session JSONL record (Qwen Code ChatRecord layout) and its SQLite index."""
