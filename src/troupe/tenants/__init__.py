"""Tenants: who a key is, what it may do, and how much of the service it may take."""
