"""What users do with results: recommend, plan a fleet, nightly runs, reports, exchange with vllm bench."""
