"""Results: the Parquet dataset of trials and requests, and how to read and rank it.

``<output>/<study>/trials/date=YYYY-MM-DD/run=<run_id>/<trial_id>.parquet`` (one row
per trial) and ``.../requests/...`` (one row per request), hive-partitioned, one
schema per study, readable with ``pandas.read_parquet`` and no project code.
"""

from orchestrator.results.analysis import (best_per_gpu, best_under_slos, capacity_by_night, config_history, config_key,
                                           param_importance)
from orchestrator.results.pareto import (constraints_mask, dominated_mask, dominates, feasible_mask, is_dominated,
                                         knee_point, normalize_objectives, pareto_front, pareto_mask)
from orchestrator.results.query import list_data_files, load_requests, load_trials
from orchestrator.results.schema import (REQUESTS_SCHEMA, SCHEMA_VERSION, constraint_summary, metric_columns,
                                         param_types_of, requests_to_table, trial_row_to_table, trials_schema)
from orchestrator.results.store import ResultsStore, ResultsWriteError

__all__ = [
    "REQUESTS_SCHEMA",
    "SCHEMA_VERSION",
    "ResultsStore",
    "ResultsWriteError",
    "best_per_gpu",
    "best_under_slos",
    "capacity_by_night",
    "config_history",
    "config_key",
    "constraint_summary",
    "constraints_mask",
    "dominated_mask",
    "dominates",
    "feasible_mask",
    "is_dominated",
    "knee_point",
    "list_data_files",
    "load_requests",
    "load_trials",
    "metric_columns",
    "normalize_objectives",
    "param_types_of",
    "pareto_front",
    "param_importance",
    "pareto_mask",
    "requests_to_table",
    "trial_row_to_table",
    "trials_schema",
]
