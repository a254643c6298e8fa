"""The study file: what to tune, on what, under which traffic and SLOs; and the judge of a trial."""
