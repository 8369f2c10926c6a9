"""Local stand-ins for remote services, for tests (127.0.0.1 only)."""
