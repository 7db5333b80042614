"""The side loops behind `aggregator.supervisor.Supervisor`, one concept per module.

What changed is noticed by manifest.py (the manifest saved), folders.py (local folders), polling.py (`poll:`
sources), pushed.py (sources that tell of their own changes) and replicas.py (other replicas' events, the poll
leases); each hands the change to updates.py, the one place that applies a change to the catalog and tells the
Notifier. plan.py says what the loops cover and signals a reload that changes it."""
