"""A package of the project: its ``tasks`` module is found by autodiscovery."""
