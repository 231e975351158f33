"""Approvals, the worker's half: ``policy`` (which tool calls wait for a person, how the
question is put, expiring unanswered requests) and ``park`` (a turn parked for an answer, and
taken back when it comes). The store is :mod:`fermix_shared.approvals`.
"""
