"""The per-node agent: triggers feed one coalescing queue; one worker reconciles.

Threads, not asyncio: a config-directory watcher, a Node watch, a periodic
resync and the device plugin's kubelet-restart signal each call
:meth:`WorkQueue.trigger`; a single worker takes one batch at a time and runs
one reconcile for it.
"""
