"""What a worker process does for the fleet, apart from any one turn.

``heartbeat`` (this process is alive), ``reaper`` (find the work of dead processes and
conversations nobody dispatches; run the features' sweeps), ``sweeper`` (what a feature
registers), ``shutdown`` (a graceful stop: finish within the grace, hand the rest over).
Started and stopped by :class:`fermix_worker.runtime.Runtime`.
"""
