"""The kubelet's pod-resources API: our own ``api.proto`` (package ``v1``), its
generated modules (``scripts/gen_podresources.py``) and a client."""
