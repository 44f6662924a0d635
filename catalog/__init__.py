"""Catalog (STAC items and queries): arrives with its own issue."""
