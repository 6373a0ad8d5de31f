"""Whether a host can run vGPUs: checks of a scan (and of a plan, when a config was
given), each ok, warn or fail with one sentence and what to do. Pure."""
