"""A linearizability check of the store contract (see README.md in this folder)."""
