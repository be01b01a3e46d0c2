"""What a person operating a run sees: metrics, progress, worker logs and warnings, the summary."""
