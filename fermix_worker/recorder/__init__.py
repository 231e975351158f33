"""The flight recorder's worker side: writing a turn's record as it runs
(:mod:`~fermix_worker.recorder.recording`), replaying it exactly
(:mod:`~fermix_worker.recorder.replay`) and forking it (:mod:`~fermix_worker.recorder.fork`).
The record's shape and store: fermix_shared/recorder/."""
