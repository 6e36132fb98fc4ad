"""What the analysis writes: verdict.json, report.html (with its charts), timeline.json.gz."""
