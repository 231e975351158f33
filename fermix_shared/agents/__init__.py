"""Agents: ``definitions`` (what an agent is: prompt, route, tools, trust; which agent a
chat is bound to) and ``lifecycle`` (pause, resume and each agent's state, fleet-wide).
"""
