"""Tier servers: one engine each, behind the shared single-tier A2M surface (`surface.py`).

Each engine implements `store.Store`; `surface.TierServer` turns any Store into
a complete A2M server. Engines import `a2m/` and this package's shared modules,
never each other.
"""
