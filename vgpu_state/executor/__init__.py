"""Executor: runs a Plan through the host port, with journal, lock and verification."""
