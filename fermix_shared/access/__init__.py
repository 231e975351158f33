"""Who may do what on the API and the console: ``tokens`` (named API tokens with a role,
stored hashed, fleet-wide) and the role ladder the gateway checks every ``/v1`` route
against (fermix_gateway/auth.py)."""
