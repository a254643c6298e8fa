"""One trial: pre-flight, deploy, load phase or capacity search, probe, and its result row."""
