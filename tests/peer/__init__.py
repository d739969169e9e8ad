"""Peer suites: other projects' own tests run against pikku, by hand (never collected in CI)."""
