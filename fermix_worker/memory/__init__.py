"""Long-term memory, the worker's half: ``review`` (one model call that turns a
conversation's turns into remembered facts) and ``reviewer`` (which turns, when, charged to
whom). The facts and the review queue are :mod:`fermix_shared.memory`.
"""
