"""The ports the engine drives: the workflow store and the lease service, as protocols."""
