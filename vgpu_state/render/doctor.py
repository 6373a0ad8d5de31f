"""A doctor report in words: one line a check, GPU by GPU, and a verdict; or JSON."""

from __future__ import annotations

import json

from vgpu_state.doctor.checks import Check, DoctorReport

MARKS = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}


def _check_line(c: Check) -> list[str]:
    lines = [f"  [{MARKS[c.status.value]}] {c.id}: {c.message}"]
    if c.action:
        lines.append(f"         → {c.action}")
    return lines


def render_report(report: DoctorReport) -> str:
    lines = [f"node {report.node or '(unnamed)'} — sysfs {report.sysfs_root}"]
    lines += [line for c in report.checks for line in _check_line(c)]
    for g in report.gpus:
        name = g.model or f"unknown device {g.device_id}"
        lines.append("")
        lines.append(f"GPU {g.index} {g.address} {name}: {g.status.value}")
        lines += [line for c in g.checks for line in _check_line(c)]
    lines.append("")
    lines += [f"unknown: {u.message}" for u in report.unknown]
    n = report.counts()
    verdict = {
        "ok": "this host can run vGPUs",
        "warn": "this host can run vGPUs, with the warnings above",
        "fail": "this host cannot run vGPUs as it is: see the FAIL lines",
    }[report.status.value]
    lines.append(f"Doctor: {n['ok']} ok, {n['warn']} warn, {n['fail']} fail — {verdict}.")
    return "\n".join(lines) + "\n"


def render_report_json(report: DoctorReport) -> str:
    doc = report.model_dump(mode="json")
    doc["summary"] = report.counts()
    return json.dumps(doc, indent=2) + "\n"
