"""Cross-worker analysis: summaries (or Kineto traces) in; verdict.json and report.html out."""
