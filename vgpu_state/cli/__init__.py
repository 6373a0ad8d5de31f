"""The ``vgpu-state`` command. Subcommands live in their own modules and load lazily,
so commands that need no cluster never import ``kubernetes`` or ``grpc``."""
