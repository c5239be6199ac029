"""Operators moved between machines: prebuilt stores (read-only directories of builds searched before the cache) and bundles (builds in one tar file, for a CI artifact or a cluster)."""
