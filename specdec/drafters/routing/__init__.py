"""Drafters that choose among others: auto (by what the target and machine allow) and select (by measured yield,
per request)."""
