"""Tests of the embedded SQLite broker transport."""
