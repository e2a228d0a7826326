"""Context compaction: thresholds, micro-compaction, full compression and history invariants."""
