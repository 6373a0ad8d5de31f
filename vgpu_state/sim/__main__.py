"""``python -m vgpu_state.sim``: the simulator's FUSE server and sriov-manage."""

import sys

from vgpu_state.sim.server import main

sys.exit(main())
