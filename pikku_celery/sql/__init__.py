"""The SQL layer's shared pieces: engines, runners, compatibility with SQLAlchemy."""
