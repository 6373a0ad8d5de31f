"""The one spelling of a Kubernetes timestamp (RFC 3339, whole seconds, UTC)."""

from __future__ import annotations

import datetime


def rfc3339(moment: datetime.datetime) -> str:
    """``moment`` as the API server writes ``metav1.Time``: ``2026-01-02T03:04:05Z``."""
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
