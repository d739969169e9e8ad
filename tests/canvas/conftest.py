"""The canvas tests' real-worker cluster (see :mod:`tests.canvas.cluster`)."""

from tests.canvas.cluster import canvas_cluster, canvas_tables, shared_canvas_cluster

__all__ = ["canvas_cluster", "canvas_tables", "shared_canvas_cluster"]
