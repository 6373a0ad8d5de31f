#!/usr/bin/env python3
"""`make demo`: the whole loop on a simulated GPU node, with the real commands.

1. validate the config;  2. plan;  3. apply;  4. assert;
5. edit the config (one vGPU fewer on the A2, one more on the L40S), plan the
   minimal diff;  6. apply again;  7. assert;  8. history;
9. the agent (scripts/demo_agent.py): a simulated node in a Kubernetes API
   emulator, installed as deploy/ installs it (plan-only); a label change is
   planned and not applied, `fleet plan` shows it; the node is promoted with
   the label vgpu-state.io/mode=enforce and the agent converges it; the
   kubelet loses a resource, and the agent notices and registers it again.

The node is a copy of configs/sim/mixed.yaml (A2 with mdevs on VFs, T4 with
mdevs on the PF, L40S with vendor-specific VFIO; one vGPU held by a VM) in a
temporary directory, so the shipped files never change. Each step checks its
exit code; the demo fails loudly if the product does not behave as shown.
"""

from __future__ import annotations

import difflib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "configs" / "examples" / "mixed-node.yaml"
NODE_SPEC = REPO / "configs" / "sim" / "mixed.yaml"


def run(title: str, args: list[str], expect: int) -> str:
    shown = " ".join(a if " " not in a else repr(a) for a in args)
    print(f"\n=== {title}\n$ vgpu-state {shown}", flush=True)
    proc = subprocess.run(
        [sys.executable, "-m", "vgpu_state.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    sys.stdout.write(proc.stdout)
    sys.stdout.write(proc.stderr)
    if proc.returncode != expect:
        raise SystemExit(
            f"demo failed: `vgpu-state {shown}` exited {proc.returncode}, expected {expect}"
        )
    return proc.stdout


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="vgpu-state-demo-"))
    try:
        node = work / "node.yaml"
        shutil.copy(NODE_SPEC, node)
        config = work / "layouts.yaml"
        shutil.copy(CONFIG, config)
        sim = ["--sim", str(node)]

        run("1. Validate the config", ["validate", "-f", str(config)], 0)
        run(
            "2. Plan: the node label nvidia.com/vgpu.config=mixed selects the layout",
            ["plan", "-f", str(config), *sim, "--detailed-exitcode"],
            2,
        )
        run("3. Apply it", ["apply", "-f", str(config), *sim, "--auto-approve"], 0)
        run("4. Assert: the node matches", ["assert", "-f", str(config), *sim], 0)

        before = config.read_text()
        after = before.replace("A2-4Q: 3", "A2-4Q: 2").replace("L40S-12Q: 2", "L40S-12Q: 3")
        config.write_text(after)
        print("\n=== 5. Edit the config")
        sys.stdout.writelines(
            difflib.unified_diff(
                before.splitlines(keepends=True),
                after.splitlines(keepends=True),
                "layouts.yaml",
                "layouts.yaml (edited)",
            )
        )
        text = run(
            "   Plan again: only what the edit changed (the T4 is untouched)",
            ["plan", "-f", str(config), *sim, "--detailed-exitcode"],
            2,
        )
        if "Plan: 1 to create, 1 to destroy, 0 blocked." not in text:
            raise SystemExit("demo failed: the second plan is not the minimal diff")
        run("6. Apply the edit", ["apply", "-f", str(config), *sim, "--auto-approve"], 0)
        run("7. Assert again", ["assert", "-f", str(config), *sim], 0)
        run("8. The journal of both applies", ["history", *sim], 0)
        import demo_agent

        demo_agent.main()
        print(
            "\nDemo complete: plan, apply and assert converged twice on the simulated node, "
            "and the agent, installed plan-only, converged it once the node was promoted."
        )
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
